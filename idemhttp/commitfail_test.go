package idemhttp_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// commitFails is a driver without the TxClaimer fast path (the generic
// ModeTx path of third-party drivers) whose COMMIT fails (and rolls back)
// the first fail times.
type commitFails struct {
	driver.RecordDriver[*sql.Tx]
	fail atomic.Int32
}

func (d *commitFails) Commit(ctx context.Context, tx *sql.Tx) error {
	if d.fail.Add(-1) >= 0 {
		_ = tx.Rollback()
		return errors.New("commit: connection reset")
	}
	return d.RecordDriver.Commit(ctx, tx)
}

// ModeTx on the generic path: the record is stored, then COMMIT fails, so
// neither the effect nor the record exists. The retry executes again (it
// must not be answered from the cache as a replay of a payment never made).
func TestCommitFailsGenericPath(t *testing.T) {
	t.Parallel()
	sq := testdb.SQLite(t)
	e := sqliteEnvOn(t, sq)
	drv := &commitFails{RecordDriver: sq}
	drv.fail.Store(1)
	mw, err := idemhttp.New[*sql.Tx](drv, &idemhttp.Config{Mode: idemhttp.ModeTx})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.Handler(effectHandler(t, e, 201, &calls))
	if first := send(h, "POST", "/pay?label=cf", "k", `{}`); first.Code < 500 {
		t.Fatalf("first attempt, COMMIT failed: %d; want a 5xx", first.Code)
	}
	if n := e.effects(t, "cf"); n != 0 {
		t.Fatalf("effects after failed commit = %d", n)
	}
	again := send(h, "POST", "/pay?label=cf", "k", `{}`)
	if again.Header().Get(idemhttp.ReplayedHeader) == "true" || again.Code != 201 {
		t.Fatalf("retry after a failed COMMIT: %d replayed=%q; want a new execution", again.Code, again.Header().Get(idemhttp.ReplayedHeader))
	}
	if n := e.effects(t, "cf"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

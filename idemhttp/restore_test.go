package idemhttp_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// A database restored from a backup (or failed over to an asynchronous
// replica that lost its last commits) has lost the idempotency records
// written after it, together with the effects they guarded (ModeTx: one
// transaction). A retry of a key the backup holds is replayed; a retry of
// a key it lost is executed again, and its effect, lost with the record,
// is applied again, once. What the handler did outside the database (here
// calls, standing for a payment provider's charge) is not rolled back:
// the handler calls it again, and only the provider's own deduplication
// keeps it from acting twice. An instance that kept running answers the
// keys it completed from its replay cache, the lost ones too, until it
// restarts: the runbook restarts every instance after the restore.
func TestRestoreForgetsLaterKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Schema(t, 4)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e := pgEnvOn(t, drv)
	var calls atomic.Int64
	h := e.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeTx}, effectHandler(t, e, 201, &calls))
	pay := func(key, label string) (code int, replayed bool, body string) {
		t.Helper()
		rr := send(h, "POST", "/pay?label="+label, key, `{"amount":"10.00","to":"bob"}`)
		return rr.Code, rr.Header().Get(idemhttp.ReplayedHeader) == "true", rr.Body.String()
	}

	if code, replayed, _ := pay("key-kept", "kept"); code != 201 || replayed {
		t.Fatalf("first request: %d, replayed %v", code, replayed)
	}
	backup := testdb.TakeSnapshot(t, schema)
	code, replayed, lostBody := pay("key-lost", "lost")
	if code != 201 || replayed {
		t.Fatalf("request after the backup: %d, replayed %v", code, replayed)
	}
	backup.Restore(t)
	if n := e.effects(t, "lost"); n != 0 {
		t.Fatalf("restored database holds %d effects of the request after the backup; want 0", n)
	}
	// The instance that kept running replays the lost key from memory.
	if code, replayed, body := pay("key-lost", "lost"); code != 201 || !replayed || body != lostBody {
		t.Errorf("retry of the lost key on the instance that kept running: %d, replayed %v, %s; want its replay cache's answer %s", code, replayed, body, lostBody)
	}
	// Restarted, it has only the database's records.
	h = e.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeTx}, effectHandler(t, e, 201, &calls))

	if code, replayed, _ := pay("key-kept", "kept"); code != 201 || !replayed {
		t.Errorf("retry of the key the backup holds: %d, replayed %v; want a replay", code, replayed)
	}
	code, replayed, body := pay("key-lost", "lost")
	if code != 201 || replayed || body == lostBody {
		t.Errorf("retry of the key the restore lost: %d, replayed %v, %s; want executed again (first answer %s)", code, replayed, body, lostBody)
	}
	if code, replayed, again := pay("key-lost", "lost"); code != 201 || !replayed || again != body {
		t.Errorf("its next retry: %d, replayed %v, %s; want the replay of %s", code, replayed, again, body)
	}
	if kept, lost := e.effects(t, "kept"), e.effects(t, "lost"); kept != 1 || lost != 1 {
		t.Errorf("effects: kept %d, lost %d; want 1 each", kept, lost)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("the handler ran %d times; want 3 (the lost key's twice: its outside calls too)", n)
	}
}

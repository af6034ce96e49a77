package idemhttp_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

// TestHandlerStatementFailureAbortsTx: a handler whose statement fails (a
// unique violation on its own table, no savepoint) and that answers a
// stored status anyway: on PostgreSQL the transaction is aborted, nothing
// is committed, and idem answers 500 transaction-aborted (not 503
// outcome-unknown, which would tell the client the command may have been
// applied); a retry executes again. SQLite does not abort the transaction:
// the 409 is committed and replayed.
func TestHandlerStatementFailureAbortsTx(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		e.exec(t, `CREATE TABLE uq (v TEXT PRIMARY KEY)`)
		e.exec(t, `INSERT INTO uq (v) VALUES ('taken')`)
		var calls atomic.Int64
		h := e.wrap(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if err := e.effect(r, "ab"); err != nil {
				t.Errorf("effect: %v", err)
			}
			if err := e.txExec(r, `INSERT INTO uq (v) VALUES ('taken')`); err == nil {
				t.Error("the duplicate INSERT succeeded")
			}
			w.WriteHeader(http.StatusConflict) // "already exists", stored
		}))
		for i := range 2 {
			rr := send(h, "POST", "/pay", "k", `{}`)
			if strings.HasPrefix(e.name, "sqlite") {
				if rr.Code != http.StatusConflict {
					t.Fatalf("attempt %d: %d, want the stored 409", i, rr.Code)
				}
				continue
			}
			checkProblem(t, rr, http.StatusInternalServerError, problem.TypeTransactionAborted)
		}
		want, effects := 2, 0
		if strings.HasPrefix(e.name, "sqlite") {
			want, effects = 1, 1 // replayed
		}
		if calls.Load() != int64(want) || e.effects(t, "ab") != effects {
			t.Fatalf("calls = %d, effects = %d; want %d and %d", calls.Load(), e.effects(t, "ab"), want, effects)
		}
	})
}

var _ = idemhttp.ModeTx

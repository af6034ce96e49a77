package saga_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/saga"
)

// isCommit matches the simple-protocol COMMIT that pgx sends.
func isCommit(b []byte) bool {
	return len(b) > 0 && b[0] == 'Q' && bytes.Contains(bytes.ToLower(b), []byte("commit"))
}

// The replies of a step's COMMIT, of a compensation's COMMIT and of the
// saga's final state change are lost with the connection (the statements
// took effect): the calls fail or retry, and running them again on another
// replica applies no effect twice and leaves the saga consistent.
func TestPostgresLostReplies(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 8)
	direct := pgDriver(t, pool, schema)
	if err := direct.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, pgTables); err != nil {
		t.Fatalf("create effect table: %v", err)
	}
	proxy := testdb.NewProxy(t)
	proxied := pgDriver(t, proxy.Pool(t, schema, 4), schema)
	f := &fixture[pgx.Tx]{drv: direct, effect: pgEffect, log: pgStepLog(pool)}
	c := f.coordinator(t, nil)
	cp, err := saga.New(proxied, &saga.Config{CompensationBackoff: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := newSagaID(t)
	f.start(t, c, id)

	// A step whose COMMIT reply is lost: Step fails, the step is
	// recorded with its effect; the retry on the other replica skips it.
	var fault *testdb.Faulted
	_, ran, err := cp.Step(ctx, id, "step-1", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		res, err := f.apply(id, "step-1")(ctx, tx)
		fault = proxy.Arm(testdb.DropReply, isCommit)
		return res, err
	})
	select {
	case <-fault.Fired():
	default:
		t.Fatalf("the fault did not fire (Step = %v, %v)", ran, err)
	}
	if err == nil {
		t.Fatalf("Step whose COMMIT reply was lost = ran %v, nil; want an error", ran)
	}
	if res := run(t, c, id, "step-1", f.apply(id, "step-1"), false); !bytes.Equal(res, resultOf("step-1")) {
		t.Errorf("retried step: result %q; want the recorded one", res)
	}
	f.mustEffects(t, id, "step-1", 1)
	run(t, c, id, "step-2", f.apply(id, "step-2"), true)

	// A compensation whose COMMIT reply is lost: a lost connection is the
	// database's fault, not an attempt, so Compensate returns it at once
	// and the saga stays compensating; the next call finds the
	// compensation recorded (its COMMIT took effect) and goes on.
	comps := f.compensations(t, id, stepsN(2))
	inner := comps["step-2"]
	comps["step-2"] = func(ctx context.Context, tx pgx.Tx, fwd saga.StepRecord) ([]byte, error) {
		res, err := inner(ctx, tx, fwd)
		fault = proxy.Arm(testdb.DropReply, isCommit)
		return res, err
	}
	err = cp.Compensate(ctx, id, comps)
	select {
	case <-fault.Fired():
	default:
		t.Fatalf("the fault did not fire during Compensate (%v)", err)
	}
	if err == nil {
		t.Fatal("Compensate with a lost COMMIT reply = nil; want the database's fault")
	}
	if s, err := c.Get(ctx, id); err != nil || s.State != saga.Compensating {
		t.Fatalf("after a lost COMMIT reply: Get = %+v, %v; want the saga %s", s, err, saga.Compensating)
	}
	if err := cp.Compensate(ctx, id, comps); err != nil {
		t.Fatalf("Compensate again: %v", err)
	}
	f.wantCompensated(t, c, id, 3)

	// The final state change's reply lost: Compensate fails, the saga is
	// compensated; another call is a no-op.
	id2 := f.runUntilFailure(t, c, 2)
	fault = proxy.Arm(testdb.DropReply, func(b []byte) bool { return bytes.Contains(b, []byte("compensated")) })
	err = cp.Compensate(ctx, id2, f.compensations(t, id2, stepsN(2)))
	select {
	case <-fault.Fired():
	default:
		t.Fatalf("the fault did not fire (Compensate: %v)", err)
	}
	if err := c.Compensate(ctx, id2, f.compensations(t, id2, stepsN(2))); err != nil {
		t.Fatalf("Compensate again: %v", err)
	}
	f.wantCompensated(t, c, id2, 2)
}

package saga_test

import (
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/saga"
)

// A List or ListAfter that cannot mean anything is an error, not an empty
// page: a recovery loop that forgot its states, misspelt one or pages
// after a saga it built by hand (no UpdatedAt) would otherwise find
// nothing to recover, round after round, and never say so.
func TestListRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := setupSQLite(t)
	c := f.coordinator(t, nil)
	id := f.runUntilFailure(t, c, 2)
	if err := c.Compensate(t.Context(), id, nil); err == nil {
		t.Fatal("Compensate without compensations succeeded; want the saga failed")
	}
	// The saga is Failed: a valid List finds it.
	if list, err := c.List(t.Context(), 10, saga.Failed); err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("List(failed) = %+v, %v; want the failed saga", list, err)
	}
	ctx := t.Context()
	if list, err := c.List(ctx, 10); err == nil {
		t.Errorf("List without states = %+v, nil; want an error", list)
	}
	if list, err := c.List(ctx, 10, saga.Failed, saga.State("FAILED")); err == nil {
		t.Errorf("List with the unknown state FAILED = %+v, nil; want an error", list)
	}
	if list, err := c.List(ctx, 0, saga.Failed); err == nil {
		t.Errorf("List with limit 0 = %+v, nil; want an error", list)
	}
	if list, err := c.ListAfter(ctx, 10, &saga.Saga{ID: "0000"}, saga.Failed); err == nil {
		t.Errorf("ListAfter a saga without UpdatedAt = %+v, nil; want an error", list)
	}
}

// Steps do not update a saga: a running saga keeps its start as
// UpdatedAt, so List(Running) returns the oldest running sagas first, the
// way to find stuck ones (docs/sagas.md, Finding stuck sagas).
func testListRunningByStart[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	first, second := newSagaID(t), newSagaID(t)
	f.start(t, c, first)
	f.start(t, c, second)
	started := mustGet(t, c, first)
	run(t, c, first, "step-1", f.apply(first, "step-1"), true)
	tx := f.begin(t)
	if _, ran, err := c.StepTx(ctx, tx, first, "step-2", f.apply(first, "step-2")); err != nil || !ran {
		t.Fatalf("StepTx = %v, %v", ran, err)
	}
	f.commit(t, tx)
	s := mustGet(t, c, first)
	if !s.UpdatedAt.Equal(started.UpdatedAt) || !s.UpdatedAt.Equal(s.CreatedAt) {
		t.Errorf("running saga after two steps: UpdatedAt %s, CreatedAt %s; want its start %s", s.UpdatedAt, s.CreatedAt, started.UpdatedAt)
	}
	var ids []string
	var after *saga.Saga
	for {
		page, err := c.ListAfter(ctx, 50, after, saga.Running)
		if err != nil {
			t.Fatalf("ListAfter(running): %v", err)
		}
		for _, s := range page {
			if s.ID == first || s.ID == second {
				ids = append(ids, s.ID)
			}
		}
		if len(page) < 50 {
			break
		}
		after = page[len(page)-1]
	}
	if len(ids) != 2 || ids[0] != first || ids[1] != second {
		t.Errorf("List(running) order of the two sagas: %v; want [%s %s], the first started first", ids, first, second)
	}
}

// ListAfter pages through the sagas in a state while others are started,
// aborted and compensated: every saga that stayed in the state and was
// not touched during the pass is listed exactly once.
func testListAfterUnderChanges[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	abort := func(id string) {
		tx := f.begin(t)
		if err := c.AbortTx(ctx, tx, id); err != nil {
			t.Errorf("AbortTx: %v", err)
		}
		f.commit(t, tx)
	}
	stable := map[string]bool{}
	var moving []string
	for i := range 60 {
		id := newSagaID(t)
		f.start(t, c, id)
		abort(id)
		if i%3 == 0 {
			moving = append(moving, id)
		} else {
			stable[id] = true
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // new compensating sagas, and some moved on
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := newSagaID(t)
			f.start(t, c, id)
			abort(id)
			if i < len(moving) {
				if err := c.Compensate(ctx, moving[i], nil); err != nil {
					t.Errorf("Compensate: %v", err)
				}
			}
		}
	})
	seen := map[string]int{}
	var after *saga.Saga
	for {
		page, err := c.ListAfter(ctx, 7, after, saga.Compensating)
		if err != nil {
			t.Fatalf("ListAfter: %v", err)
		}
		for _, s := range page {
			seen[s.ID]++
		}
		if len(page) < 7 {
			break
		}
		after = page[len(page)-1]
		time.Sleep(time.Millisecond) // let the writer move things
	}
	close(stop)
	wg.Wait()
	for id := range stable {
		if seen[id] != 1 {
			t.Errorf("saga %s, compensating throughout, listed %d times; want once", id, seen[id])
		}
	}
}

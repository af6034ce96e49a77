package saga_test

import (
	"testing"

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

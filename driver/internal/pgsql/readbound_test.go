package pgsql

import (
	"fmt"
	"testing"
)

// Cut keeps the rows read until the next would pass the bound, always the
// first, and none after the first left out (a later, smaller row of the
// same key must not go before it); a claim that read half the bound or
// more makes the next use the statement that cuts on the server.
func TestReadBoundCut(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sizes     []int
		max       int
		kept      int
		nextLarge bool
	}{
		{[]int{10, 20, 30}, 0, 3, false},
		{[]int{10, 20, 30}, 1000, 3, false},
		{[]int{10, 20, 30}, 60, 3, true},
		{[]int{10, 20, 30}, 59, 2, true},
		{[]int{10, 100, 5, 5}, 50, 1, true}, // not 10 then 5 and 5
		{[]int{500}, 50, 1, true},           // larger than the bound: alone
		{[]int{500, 1}, 50, 1, true},
		{nil, 50, 0, false},
	} {
		var b ReadBound
		b.large.Store(!tc.nextLarge) // Cut must set it either way
		i := 0
		got := Cut(&b, tc.max, func() (int, int, bool) {
			if i == len(tc.sizes) {
				return 0, 0, false
			}
			i++
			return i - 1, tc.sizes[i-1], true
		})
		what := fmt.Sprintf("sizes %v, max %d", tc.sizes, tc.max)
		if i != len(tc.sizes) {
			t.Errorf("%s: read %d rows; want all %d (the statement is drained)", what, i, len(tc.sizes))
		}
		if len(got) != tc.kept {
			t.Errorf("%s: kept %v; want the first %d", what, got, tc.kept)
		}
		for j, r := range got {
			if r != j {
				t.Errorf("%s: kept %v; want a prefix", what, got)
			}
		}
		if tc.max > 0 && b.large.Load() != tc.nextLarge {
			t.Errorf("%s: large = %v; want %v", what, b.large.Load(), tc.nextLarge)
		}
		if sql, bounded := b.Statement(tc.max); bounded != (tc.max > 0 && tc.nextLarge) || bounded != (sql == OutboxReadBoundedSQL) {
			t.Errorf("%s: Statement bounded = %v", what, bounded)
		}
	}
}

package stallmeter_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/internal/stallmeter"
)

func TestStall(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ gap, want time.Duration }{
		{stallmeter.Tick, 0},
		{stallmeter.Tick + stallmeter.Threshold, 0},
		{4 * time.Second, 4*time.Second - stallmeter.Tick},
	} {
		if got := stallmeter.Stall(c.gap); got != c.want {
			t.Errorf("Stall(%s) = %s, want %s", c.gap, got, c.want)
		}
	}
}

// A wait is not a stall: the bound of a test still sees it.
func TestWaitIsNotAStall(t *testing.T) {
	t.Parallel()
	m := stallmeter.Start(t)
	time.Sleep(time.Second)
	ran, stalled := m.Elapsed()
	if ran < time.Second-stalled || ran > 10*time.Second {
		t.Errorf("ran %s, stalled %s after a 1s sleep", ran, stalled)
	}
	t.Logf("ran %s, stalled %s", ran, stalled)
}

package app

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A failed count keeps the gauge at its last value and is logged once
// (repeats within lagLogInterval suppressed), and once more when a count
// succeeds again.
func TestParkedCheckerKeepsLastValueOnFailure(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	n, fail := 3, error(nil)
	c := &parkedChecker{
		count:    func(context.Context) (int, error) { return n, fail },
		m:        newMetrics(),
		log:      slog.New(slog.NewTextHandler(&logs, nil)),
		interval: time.Second,
		wake:     make(chan struct{}, 1),
	}
	gauge := func() float64 { return testutil.ToFloat64(c.m.parkedNow) }
	c.check(t.Context())
	if gauge() != 3 {
		t.Fatalf("gauge %v after counting 3", gauge())
	}
	n, fail = 0, errors.New("database down")
	c.check(t.Context())
	c.check(t.Context())
	if gauge() != 3 {
		t.Errorf("gauge %v after failed counts; want the last value, 3", gauge())
	}
	if got := strings.Count(logs.String(), "parked events unknown"); got != 1 {
		t.Errorf("%d failure lines for two failed counts in a row; want 1:\n%s", got, logs.String())
	}
	fail = nil
	c.check(t.Context())
	if gauge() != 0 {
		t.Errorf("gauge %v after counting 0 again", gauge())
	}
	if !strings.Contains(logs.String(), "parked events counted again") || !strings.Contains(logs.String(), "failed_counts=2") {
		t.Errorf("no line for the end of the failures:\n%s", logs.String())
	}
	// A wake-up never blocks, even with one pending.
	c.parked()
	c.parked()
}

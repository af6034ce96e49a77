package cleanup_test

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/testdb"
)

func TestDefaultScheduleIsDailyAt3(t *testing.T) {
	t.Parallel()
	loc := time.FixedZone("UTC+05:30", 5*3600+1800)
	c, err := cleanup.New(testdb.SQLite(t), &cleanup.Config{Location: loc})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ now, want time.Time }{
		{time.Date(2031, 3, 14, 15, 9, 0, 0, loc), time.Date(2031, 3, 15, 3, 0, 0, 0, loc)},
		{time.Date(2031, 3, 14, 2, 59, 59, 0, loc), time.Date(2031, 3, 14, 3, 0, 0, 0, loc)},
		{time.Date(2031, 3, 14, 3, 0, 0, 0, loc), time.Date(2031, 3, 15, 3, 0, 0, 0, loc)},
		// The same instant given in UTC: the schedule is in Location.
		{time.Date(2031, 3, 14, 20, 0, 0, 0, time.UTC), time.Date(2031, 3, 15, 3, 0, 0, 0, loc)},
	} {
		if got := c.Next(tc.now); !got.Equal(tc.want) {
			t.Errorf("Next(%s) = %s; want %s", tc.now, got, tc.want)
		}
	}
}

func TestRunSweepsOnScheduleUntilCancelled(t *testing.T) {
	t.Parallel()
	var sweeps atomic.Int32
	c, err := cleanup.New(testdb.SQLite(t), &cleanup.Config{
		Schedule: "@every 1s",
		Logger:   slog.New(slog.DiscardHandler),
		OnSweep: func(r cleanup.Report) {
			if !r.Skipped {
				sweeps.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	time.Sleep(2500 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel = %v; want nil", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if n := sweeps.Load(); n < 1 || n > 3 {
		t.Errorf("%d sweeps in 2.5s of @every 1s; want 1..3", n)
	}
}

// A Rule gets now - TTL as its cutoff and is called until it deletes fewer
// rows than the batch size.
func TestRuleExtension(t *testing.T) {
	t.Parallel()
	now := time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)
	left := 25
	var cutoffs []time.Time
	var reports []cleanup.Report
	c, err := cleanup.New(testdb.SQLite(t), &cleanup.Config{
		Now:       func() time.Time { return now },
		BatchSize: 10,
		Pause:     time.Millisecond,
		Logger:    slog.New(slog.DiscardHandler),
		OnSweep:   func(r cleanup.Report) { reports = append(reports, r) },
		Rules: []cleanup.Rule{{
			Table: "audit_log",
			TTL:   7 * 24 * time.Hour,
			Delete: func(_ context.Context, _ driver.Executor, before time.Time, limit int) (int, error) {
				cutoffs = append(cutoffs, before)
				n := min(limit, left)
				left -= n
				return n, nil
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tables := []string{}
	for _, tr := range rep.Tables {
		tables = append(tables, tr.Table)
	}
	if want := []string{cleanup.TableRecords, cleanup.TableInbox, cleanup.TableOutbox, cleanup.TableSagas, "audit_log"}; !slices.Equal(tables, want) {
		t.Errorf("swept %v; want %v in that order", tables, want)
	}
	if rep.Deleted("audit_log") != 25 || len(cutoffs) != 3 || rep.Tables[4].Batches != 3 {
		t.Errorf("audit_log: deleted %d in %d calls (report %+v); want 25 in 3", rep.Deleted("audit_log"), len(cutoffs), rep.Tables[4])
	}
	for _, b := range cutoffs {
		if !b.Equal(now.Add(-7 * 24 * time.Hour)) {
			t.Errorf("cutoff %s; want now - 7d", b)
		}
	}
	if len(reports) != 1 || reports[0].TotalDeleted() != 25 {
		t.Errorf("OnSweep got %+v; want the one report", reports)
	}
}

// robfig/cron makes any @every delay under 1s (zero, negative) one second:
// such a schedule is refused, not swept every second.
func TestEveryUnderASecondRefused(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"@every 0s", "@every -24h", "@every 1ms", "CRON_TZ=UTC @every 500ms"} {
		if err := cleanup.CheckSchedule(s); err == nil {
			t.Errorf("CheckSchedule(%q) = nil; want an error", s)
		}
	}
	for _, s := range []string{"@every 1s", "@every 6h", "@daily"} {
		if err := cleanup.CheckSchedule(s); err != nil {
			t.Errorf("CheckSchedule(%q): %v", s, err)
		}
	}
}

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

// A daily schedule sweeps once on every calendar day of its time zone, on
// the days the clocks change too: a time the clocks skip (the
// spring-forward gap) sweeps when they jump past it, and a time they repeat
// (the fall-back hour) sweeps once, at its first occurrence. In Eastern
// Europe the clocks jump from 03:00 to 04:00 and fall back from 04:00 to
// 03:00, so the default schedule is the case; 02:30 in New York too.
func TestScheduleAcrossDST(t *testing.T) {
	t.Parallel()
	helsinki, err := time.LoadLocation("Europe/Helsinki")
	if err != nil {
		t.Fatal(err)
	}
	newYork, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	utc := func(y int, m time.Month, d, h, mi int) time.Time { return time.Date(y, m, d, h, mi, 0, 0, time.UTC) }
	for _, tc := range []struct {
		name     string
		schedule string
		loc      *time.Location
		from     time.Time
		want     []time.Time // the next sweeps after from, in UTC
	}{
		{"default schedule, Helsinki, spring forward", "", helsinki, utc(2031, 3, 28, 12, 0), []time.Time{
			utc(2031, 3, 29, 1, 0), // 03:00 EET
			utc(2031, 3, 30, 1, 0), // 03:00 does not exist: 04:00 EEST, when the clocks jump
			utc(2031, 3, 31, 0, 0), // 03:00 EEST
		}},
		{"default schedule, Helsinki, fall back", "", helsinki, utc(2031, 10, 25, 12, 0), []time.Time{
			utc(2031, 10, 26, 0, 0), // 03:00 EEST, the first of the two 03:00s
			utc(2031, 10, 27, 1, 0), // 03:00 EET
		}},
		{"CRON_TZ, Helsinki, spring forward", "CRON_TZ=Europe/Helsinki 0 3 * * *", time.UTC, utc(2031, 3, 29, 12, 0), []time.Time{
			utc(2031, 3, 30, 1, 0),
			utc(2031, 3, 31, 0, 0),
		}},
		{"02:30, New York, spring forward", "30 2 * * *", newYork, utc(2031, 3, 8, 12, 0), []time.Time{
			utc(2031, 3, 9, 7, 0),   // 02:30 does not exist: 03:00 EDT
			utc(2031, 3, 10, 6, 30), // 02:30 EDT
		}},
		{"Helsinki, in the second pass of the repeated hour", "45 3 * * *", helsinki, utc(2031, 10, 26, 1, 30), []time.Time{
			utc(2031, 10, 27, 1, 45), // 03:45 EEST was the first 03:45, already past
		}},
		{"01:30, New York, fall back", "30 1 * * *", newYork, utc(2031, 11, 1, 12, 0), []time.Time{
			utc(2031, 11, 2, 5, 30), // 01:30 EDT, the first of the two 01:30s
			utc(2031, 11, 3, 6, 30), // 01:30 EST
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := cleanup.New(testdb.SQLite(t), &cleanup.Config{Schedule: tc.schedule, Location: tc.loc, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			at := tc.from
			for _, want := range tc.want {
				// Run asks for the next sweep a little after the last one.
				got := c.Next(at)
				if !got.Equal(want) {
					t.Fatalf("Next(%s) = %s; want %s", at.In(tc.loc), got.In(tc.loc), want.In(tc.loc))
				}
				at = got.Add(5 * time.Second)
			}
		})
	}
}

package cleanup_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

func noDelete(context.Context, driver.Executor, time.Time, int) (int, error) { return 0, nil }

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	tests := []struct {
		name    string
		cfg     cleanup.Config
		wantErr string // "" means valid
	}{
		{"Defaults", cleanup.Config{}, ""},
		{"InboxTTL24h", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: 24 * time.Hour}}, ""},
		{"InboxTTL72h", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: 72 * time.Hour}}, ""},
		{"InboxTTL1hRejected", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: time.Hour}}, "Inbox.TTL 1h0m0s is outside"},
		{"InboxTTL1hWithReason", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: time.Hour, OverrideReason: "topic retention is 30 minutes"}}, ""},
		{"InboxTTL1hBlankReason", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: time.Hour, OverrideReason: "  "}}, "Inbox.TTL 1h0m0s is outside"},
		{"InboxTTL100hRejected", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: 100 * time.Hour}}, "Inbox.TTL 100h0m0s is outside"},
		{"InboxTTL100hWithReason", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: 100 * time.Hour, OverrideReason: "7-day topic"}}, ""},
		{"InboxTTLNegative", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: -time.Hour, OverrideReason: "x"}}, "Inbox.TTL -1h0m0s must be positive"},
		{"InboxDisabledIgnoresTTL", cleanup.Config{Inbox: cleanup.InboxRetention{Disabled: true, TTL: time.Hour}}, ""},
		{"NegativeHorizon", cleanup.Config{Inbox: cleanup.InboxRetention{RedeliveryHorizon: -time.Hour}}, "RedeliveryHorizon"},
		// A window the user says is too short: a redelivered event would be
		// applied twice. Refused, whatever the override says.
		{"InboxShorterThanHorizon", cleanup.Config{Inbox: cleanup.InboxRetention{RedeliveryHorizon: 7 * 24 * time.Hour}, Sagas: cleanup.SagaRetention{TTL: 7 * 24 * time.Hour}},
			"Inbox.TTL 72h0m0s is shorter than Inbox.RedeliveryHorizon 168h0m0s"},
		{"InboxShorterThanHorizonOverride", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: 100 * time.Hour, OverrideReason: "x", RedeliveryHorizon: 7 * 24 * time.Hour}, Sagas: cleanup.SagaRetention{TTL: 7 * 24 * time.Hour}},
			"Inbox.TTL 100h0m0s is shorter than Inbox.RedeliveryHorizon"},
		{"InboxCoversHorizon", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: 7 * 24 * time.Hour, OverrideReason: "7-day topic", RedeliveryHorizon: 7 * 24 * time.Hour}, Sagas: cleanup.SagaRetention{TTL: 7 * 24 * time.Hour}}, ""},
		{"SagasShorterThanHorizon", cleanup.Config{Inbox: cleanup.InboxRetention{TTL: 100 * time.Hour, OverrideReason: "4-day topic", RedeliveryHorizon: 100 * time.Hour}},
			"Sagas.TTL 72h0m0s is shorter than Inbox.RedeliveryHorizon 100h0m0s"},
		{"SagasShorterThanHorizonInboxDisabled", cleanup.Config{Inbox: cleanup.InboxRetention{Disabled: true, RedeliveryHorizon: 100 * time.Hour}},
			"Sagas.TTL 72h0m0s is shorter than Inbox.RedeliveryHorizon 100h0m0s"},
		{"HorizonBothDisabled", cleanup.Config{Inbox: cleanup.InboxRetention{Disabled: true, RedeliveryHorizon: 100 * time.Hour}, Sagas: cleanup.SagaRetention{Disabled: true}}, ""},
		{"OutboxTTLNegative", cleanup.Config{Outbox: cleanup.OutboxRetention{TTL: -time.Minute}}, "Outbox.TTL"},
		{"BadCron", cleanup.Config{Schedule: "61 * * * *"}, `Schedule "61 * * * *"`},
		{"GarbageCron", cleanup.Config{Schedule: "every night"}, `Schedule "every night"`},
		{"SixFieldCron", cleanup.Config{Schedule: "0 0 3 * * *"}, `Schedule "0 0 3 * * *"`},
		{"MalformedTZ", cleanup.Config{Schedule: "CRON_TZ=UTC"}, `Schedule "CRON_TZ=UTC"`},
		{"UnknownTZ", cleanup.Config{Schedule: "CRON_TZ=Nowhere/Atlantis 0 3 * * *"}, "Nowhere/Atlantis"},
		{"NeverFires", cleanup.Config{Schedule: "0 3 30 2 *"}, "never fires"},
		{"Descriptor", cleanup.Config{Schedule: "@daily"}, ""},
		{"Every", cleanup.Config{Schedule: "@every 6h"}, ""},
		{"WithTZ", cleanup.Config{Schedule: "CRON_TZ=UTC 30 2 * * 1-5"}, ""},
		{"BatchSizeNegative", cleanup.Config{BatchSize: -1}, "BatchSize -1"},
		{"PauseNegative", cleanup.Config{Pause: -5 * time.Millisecond}, "Pause -5ms"},
		{"NoPause", cleanup.Config{Pause: cleanup.NoPause}, ""},
		{"LeaseTooShort", cleanup.Config{Lease: 500 * time.Millisecond}, "Lease 500ms"},
		{"HoldNegative", cleanup.Config{Hold: -time.Second}, "Hold -1s"},
		{"NoHold", cleanup.Config{Hold: cleanup.NoHold}, ""},
		{"BadLockName", cleanup.Config{LockName: " leading space"}, "LockName"},
		{"PartitionsAheadNegative", cleanup.Config{PartitionsAhead: -1}, "PartitionsAhead"},
		{"RuleWithoutTable", cleanup.Config{Rules: []cleanup.Rule{{Delete: noDelete}}}, "Table is required"},
		{"RuleWithoutDelete", cleanup.Config{Rules: []cleanup.Rule{{Table: "audit_log"}}}, "Delete is required"},
		{"RuleBuiltinName", cleanup.Config{Rules: []cleanup.Rule{{Table: cleanup.TableInbox, Delete: noDelete}}}, "built-in"},
		{"RuleTwice", cleanup.Config{Rules: []cleanup.Rule{{Table: "audit_log", Delete: noDelete}, {Table: "audit_log", Delete: noDelete}}}, "used twice"},
		{"RuleNegativeTTL", cleanup.Config{Rules: []cleanup.Rule{{Table: "audit_log", TTL: -1, Delete: noDelete}}}, "TTL"},
		{"Rule", cleanup.Config{Rules: []cleanup.Rule{{Table: "audit_log", TTL: 7 * 24 * time.Hour, Delete: noDelete}}}, ""},
		{"RuleSagaIsBuiltin", cleanup.Config{Rules: []cleanup.Rule{{Table: cleanup.TableSagas, Delete: noDelete}}}, "built-in"},
		{"SagasTTL24h", cleanup.Config{Sagas: cleanup.SagaRetention{TTL: 24 * time.Hour}}, ""},
		{"SagasTTL30d", cleanup.Config{Sagas: cleanup.SagaRetention{TTL: 30 * 24 * time.Hour}}, ""},
		{"SagasTTL1hRejected", cleanup.Config{Sagas: cleanup.SagaRetention{TTL: time.Hour}}, "Sagas.TTL 1h0m0s is under 24h0m0s"},
		{"SagasTTL1hWithReason", cleanup.Config{Sagas: cleanup.SagaRetention{TTL: time.Hour, OverrideReason: "load test database"}}, ""},
		{"SagasTTLNegative", cleanup.Config{Sagas: cleanup.SagaRetention{TTL: -time.Hour, OverrideReason: "x"}}, "Sagas.TTL -1h0m0s must be positive"},
		{"SagasDisabledIgnoresTTL", cleanup.Config{Sagas: cleanup.SagaRetention{Disabled: true, TTL: time.Hour}}, ""},
		{"PartitionedInboxOnSQLite", cleanup.Config{PartitionedInbox: true}, "no inbox partition mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.Logger = slog.New(slog.DiscardHandler)
			c, err := cleanup.New(drv, &cfg)
			if tt.wantErr == "" {
				if err != nil || c == nil {
					t.Fatalf("New(%s) = %v, %v; want a cleaner", tt.name, c, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New(%s) error = %v; want one containing %q", tt.name, err, tt.wantErr)
			}
		})
	}
}

func TestNilConfigAndDriver(t *testing.T) {
	t.Parallel()
	if _, err := cleanup.New(testdb.SQLite(t), nil); err != nil {
		t.Errorf("New(drv, nil): %v", err)
	}
	if _, err := cleanup.New[any](nil, nil); err == nil {
		t.Error("New(nil, nil) = nil error")
	}
}

// logs captures what New logs at Warn and above.
func logs(t *testing.T, cfg cleanup.Config) string {
	t.Helper()
	var buf bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if _, err := cleanup.New(testdb.SQLite(t), &cfg); err != nil {
		t.Fatalf("New: %v", err)
	}
	return buf.String()
}

func TestWarnings(t *testing.T) {
	t.Parallel()
	week := 7 * 24 * time.Hour
	tests := []struct {
		name string
		cfg  cleanup.Config
		want []string // substrings of the log; none means no warning at all
	}{
		{"Defaults", cleanup.Config{}, nil},
		{"InboxCoversRedeliveryHorizon",
			cleanup.Config{Inbox: cleanup.InboxRetention{TTL: 72 * time.Hour, RedeliveryHorizon: 72 * time.Hour}}, nil},
		{"InboxAndSagasCoverAWeek",
			cleanup.Config{Inbox: cleanup.InboxRetention{TTL: week, OverrideReason: "7-day topic", RedeliveryHorizon: week}, Sagas: cleanup.SagaRetention{TTL: week}},
			[]string{"level=WARN", "inbox retention outside", `reason="7-day topic"`}},
		{"Override",
			cleanup.Config{Inbox: cleanup.InboxRetention{TTL: time.Hour, OverrideReason: "dev box"}},
			[]string{"level=WARN", "inbox retention outside", `reason="dev box"`}},
		{"SagasShorterThanInbox",
			cleanup.Config{Sagas: cleanup.SagaRetention{TTL: 48 * time.Hour}},
			[]string{"level=WARN", "MISCONFIGURATION: finished sagas are deleted", "saga_ttl=48h0m0s", "inbox_ttl=72h0m0s"}},
		{"SagasLongerThanInbox", cleanup.Config{Sagas: cleanup.SagaRetention{TTL: 30 * 24 * time.Hour}}, nil},
		{"SagasInboxDisabled", cleanup.Config{Inbox: cleanup.InboxRetention{Disabled: true}, Sagas: cleanup.SagaRetention{TTL: 24 * time.Hour}}, nil},
		{"SagasOverride",
			cleanup.Config{Inbox: cleanup.InboxRetention{Disabled: true}, Sagas: cleanup.SagaRetention{TTL: time.Hour, OverrideReason: "load test"}},
			[]string{"level=WARN", "finished-saga retention under", `reason="load test"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := logs(t, tt.cfg)
			if len(tt.want) == 0 && out != "" {
				t.Errorf("log = %q; want nothing", out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("log = %q; want it to contain %q", out, w)
				}
			}
		})
	}
}

// A sweep that fails before any table (the lease cannot be taken: the
// database is down) is reported to OnSweep as failed.
func TestOnSweepSeesAFailedSweep(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	var got []cleanup.Report
	c, err := cleanup.New(drv, &cleanup.Config{OnSweep: func(r cleanup.Report) { got = append(got, r) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	_ = drv.Close()
	_, err = c.RunOnce(t.Context())
	if err == nil {
		t.Fatal("RunOnce on a closed database: nil error")
	}
	if len(got) != 2 || got[0].Err != nil || !errors.Is(got[1].Err, err) {
		t.Fatalf("OnSweep reports: %+v; want a first without Err, a second with RunOnce's error %v", got, err)
	}
}

// A sweep cut short by its context's cancellation (Run's, at shutdown) is
// Interrupted and logged at Info, not as a failure at Error; a sweep whose
// rule fails, or whose context passed its deadline, is a failure.
func TestSweepInterruptedIsNotAFailure(t *testing.T) {
	t.Parallel()
	type want struct {
		interrupted bool
		level       string
	}
	tests := []struct {
		name string
		// del is the rule's Delete; cancel ends RunOnce's context.
		del  func(cancel context.CancelCauseFunc) (int, error)
		ctx  func(t *testing.T) (context.Context, context.CancelCauseFunc)
		want want
	}{{
		name: "cancelled mid-sweep",
		del: func(cancel context.CancelCauseFunc) (int, error) {
			cancel(errors.New("shutting down"))
			return 10, nil // a full batch: the sweep pauses, and sees ctx end
		},
		want: want{interrupted: true, level: "INFO"},
	}, {
		name: "rule fails",
		del:  func(context.CancelCauseFunc) (int, error) { return 0, errors.New("disk full") },
		want: want{level: "ERROR"},
	}, {
		name: "deadline passed mid-sweep",
		del: func(context.CancelCauseFunc) (int, error) {
			time.Sleep(60 * time.Millisecond)
			return 10, nil
		},
		ctx: func(t *testing.T) (context.Context, context.CancelCauseFunc) {
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			return ctx, func(error) { cancel() }
		},
		want: want{level: "ERROR"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancelCause(t.Context())
			if tt.ctx != nil {
				ctx, cancel = tt.ctx(t)
			}
			defer cancel(nil)
			var buf testlog.Buffer
			var got []cleanup.Report
			c, err := cleanup.New(testdb.SQLite(t), &cleanup.Config{
				BatchSize: 10,
				Pause:     time.Hour,
				Logger:    slog.New(slog.NewTextHandler(&buf, nil)),
				OnSweep:   func(r cleanup.Report) { got = append(got, r) },
				Rules: []cleanup.Rule{{
					Table: "audit_log",
					TTL:   7 * 24 * time.Hour,
					Delete: func(context.Context, driver.Executor, time.Time, int) (int, error) {
						return tt.del(cancel)
					},
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := c.RunOnce(ctx)
			if err == nil {
				t.Fatal("RunOnce: nil error; want the sweep's")
			}
			if rep.Interrupted != tt.want.interrupted || len(got) != 1 || got[0].Interrupted != tt.want.interrupted {
				t.Errorf("Report.Interrupted = %v (OnSweep got %d reports); want %v", rep.Interrupted, len(got), tt.want.interrupted)
			}
			var line string
			for l := range strings.Lines(buf.String()) {
				if strings.Contains(l, "cleanup: sweep") {
					line = l
				}
			}
			if !strings.Contains(line, "level="+tt.want.level) {
				t.Errorf("sweep logged as %q; want level %s", line, tt.want.level)
			}
		})
	}
}

// A sweep in which a table failed is a failure, also when the shutdown then
// cancels it: the table's error is not hidden as an interruption (logged
// at Info, counted as interrupted by idemd).
func TestFailedTableThenCancelledIsAFailure(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	var buf testlog.Buffer
	c, err := cleanup.New(testdb.SQLite(t), &cleanup.Config{
		BatchSize: 10,
		Pause:     time.Hour,
		Logger:    slog.New(slog.NewTextHandler(&buf, nil)),
		Rules: []cleanup.Rule{{
			Table: "audit_log",
			Delete: func(context.Context, driver.Executor, time.Time, int) (int, error) {
				return 0, errors.New("permission denied for table audit_log")
			},
		}, {
			Table: "sessions",
			Delete: func(context.Context, driver.Executor, time.Time, int) (int, error) {
				cancel(errors.New("shutting down"))
				return 10, nil
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.RunOnce(ctx)
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("RunOnce = %v; want audit_log's error", err)
	}
	if rep.Interrupted {
		t.Error("Report.Interrupted = true; want false: audit_log failed before the shutdown")
	}
	if !strings.Contains(buf.String(), "level=ERROR msg=\"cleanup: sweep failed\"") {
		t.Errorf("sweep logged as %q; want cleanup: sweep failed at ERROR", buf.String())
	}
}

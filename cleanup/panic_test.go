package cleanup_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/observe/observetest"
)

// panickingDeletes is a SQLite driver whose record sweep panics, as a
// driver with a bug would.
type panickingDeletes struct{ *sqlitedriver.Driver }

func (d panickingDeletes) Executor() driver.Executor { return panickingExecutor{d.Driver.Executor()} }

type panickingExecutor struct{ driver.Executor }

func (panickingExecutor) RecordDeleteExpired(context.Context, *driver.RecordDeleteExpiredParams) (driver.DeleteResult[driver.RecordCursor], error) {
	panic("driver bug")
}

// TestSweepPanic: a panic of the driver during a sweep goes on to RunOnce's
// caller, but first the sweep's span ends with the panic as its error,
// OnSweep gets the sweep as failed, and the lease is released (its
// renewals stopped), so that the next sweep, here or on another replica,
// runs. It used to leave the span unended, skip OnSweep, and keep renewing
// the lease in the background: every replica skipped every sweep.
func TestSweepPanic(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	rec := &observetest.Recorder{}
	var got []cleanup.Report
	cfg := &cleanup.Config{
		Inbox: cleanup.InboxRetention{Disabled: true}, Outbox: cleanup.OutboxRetention{Disabled: true},
		Sagas: cleanup.SagaRetention{Disabled: true}, Lease: time.Second, Hold: cleanup.NoHold,
		Tracer: rec, OnSweep: func(r cleanup.Report) { got = append(got, r) },
	}
	c, err := cleanup.New(panickingDeletes{drv}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if p := recover(); p != "driver bug" {
				t.Errorf("RunOnce panicked with %v, want the driver's panic", p)
			}
		}()
		_, _ = c.RunOnce(t.Context())
	}()
	spans := rec.Named("idem.cleanup.sweep")
	if len(spans) != 1 || !spans[0].Ended() || spans[0].Err() == nil || !strings.Contains(spans[0].Err().Error(), "driver bug") {
		t.Errorf("sweep spans %v: want one, ended with the panic as its error", spans)
	}
	if len(got) != 1 || got[0].Err == nil || !strings.Contains(got[0].Err.Error(), "driver bug") || got[0].Skipped {
		t.Errorf("OnSweep reports %+v: want one, failed with the panic", got)
	}
	// Another replica (another Cleaner: another owner) sweeps at once:
	// the lease was released.
	other, err := cleanup.New(drv, &cleanup.Config{Lease: time.Second, Hold: cleanup.NoHold})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := other.RunOnce(t.Context())
	if err != nil || rep.Skipped {
		t.Fatalf("next sweep on another replica: skipped %v, err %v; want it run", rep.Skipped, err)
	}
}

// TestSweepPanicReportsTable: the report of a sweep in which a table's
// sweep panicked names that table, with the panic as its error. The panicked table used to be missing
// from Report.Tables (and from the sweep's log): OnSweep's report showed
// a failed sweep whose tables had all gone well.
func TestSweepPanicReportsTable(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	var got []cleanup.Report
	cfg := &cleanup.Config{
		Inbox: cleanup.InboxRetention{Disabled: true}, Outbox: cleanup.OutboxRetention{Disabled: true},
		Sagas: cleanup.SagaRetention{Disabled: true}, Lease: time.Second, Hold: cleanup.NoHold,
		OnSweep: func(r cleanup.Report) { got = append(got, r) },
	}
	c, err := cleanup.New(panickingDeletes{drv}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if p := recover(); p != "driver bug" {
				t.Errorf("RunOnce panicked with %v, want the driver's panic", p)
			}
		}()
		_, _ = c.RunOnce(t.Context())
	}()
	if len(got) != 1 {
		t.Fatalf("%d OnSweep reports, want 1", len(got))
	}
	var tables []string
	for _, tr := range got[0].Tables {
		tables = append(tables, tr.Table)
	}
	if len(got[0].Tables) != 1 || got[0].Tables[0].Table != cleanup.TableRecords {
		t.Fatalf("report tables %v, want [%s]", tables, cleanup.TableRecords)
	}
	if tr := got[0].Tables[0]; tr.Err == nil || !strings.Contains(tr.Err.Error(), "driver bug") {
		t.Errorf("table %s error %v, want the panic", tr.Table, tr.Err)
	}
}

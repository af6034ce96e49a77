package app

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/internal/orders"
)

// An order that stays in need of an operator (or waiting for older events)
// round after round is a gauge of 1, not a counter that grows every round;
// the counter counts actions taken.
func TestWatchdogMetrics(t *testing.T) {
	m := newMetrics()
	for range 3 {
		m.watchdog(orders.WatchdogStats{Stuck: 1, Redriven: 2, Operator: 1, Waiting: 4})
	}
	if got := testutil.ToFloat64(m.operator); got != 1 {
		t.Errorf("idemd_orders_needing_operator = %v; want 1", got)
	}
	if got := testutil.ToFloat64(m.waiting); got != 4 {
		t.Errorf("idemd_orders_waiting_for_events = %v; want 4", got)
	}
	if got := testutil.ToFloat64(m.stuck.WithLabelValues("redriven")); got != 3 {
		t.Errorf(`idemd_order_watchdog_orders_total{action="redriven"} = %v; want 3 (one per round)`, got)
	}
	m.watchdog(orders.WatchdogStats{})
	if got := testutil.ToFloat64(m.operator) + testutil.ToFloat64(m.waiting); got != 0 {
		t.Errorf("gauges after a round with nothing stuck = %v; want 0", got)
	}
}

// A sweep that failed before any table counts as failed; one cut short by
// the shutdown as interrupted, not failed.
func TestSweepMetrics(t *testing.T) {
	m := newMetrics()
	m.sweep(cleanup.Report{Err: errors.New("acquire lease: database is closed")})
	m.sweep(cleanup.Report{Err: context.Canceled, Interrupted: true})
	m.sweep(cleanup.Report{Skipped: true})
	m.sweep(cleanup.Report{Tables: []cleanup.TableReport{{Table: cleanup.TableInbox, Deleted: 5}}})
	for result, want := range map[string]float64{"failed": 1, "skipped": 1, "done": 1, "interrupted": 1} {
		if got := testutil.ToFloat64(m.sweeps.WithLabelValues(result)); got != want {
			t.Errorf(`idemd_cleanup_sweeps_total{result=%q} = %v; want %v`, result, got, want)
		}
	}
	if got := testutil.ToFloat64(m.deleted.WithLabelValues(cleanup.TableInbox)); got != 5 {
		t.Errorf("deleted rows of the inbox = %v; want 5", got)
	}
}

// A watchdog round that failed reports what it did: its actions count, its
// partial gauges do not replace those of the last complete round.
func TestWatchdogMetricsOfAFailedRound(t *testing.T) {
	m := newMetrics()
	m.watchdog(orders.WatchdogStats{Operator: 2, Waiting: 3})
	m.watchdog(orders.WatchdogStats{Aborted: 1, Partial: true})
	if got := testutil.ToFloat64(m.stuck.WithLabelValues("aborted")); got != 1 {
		t.Errorf(`idemd_order_watchdog_orders_total{action="aborted"} = %v; want the failed round's abort`, got)
	}
	if op, w := testutil.ToFloat64(m.operator), testutil.ToFloat64(m.waiting); op != 2 || w != 3 {
		t.Errorf("gauges after a failed round = %v, %v; want the complete round's 2, 3", op, w)
	}
}

// Every series whose labels are known in advance is exported at 0 from the
// start, so that increase() sees the first event: the retention sweep's
// deleted rows of each table too, before any sweep deleted from it.
func TestMetricsExportedAtZero(t *testing.T) {
	m := newMetrics()
	want := "# HELP idemd_cleanup_deleted_rows_total Rows the retention sweep deleted, by table.\n" +
		"# TYPE idemd_cleanup_deleted_rows_total counter\n"
	for _, table := range []string{cleanup.TableRecords, cleanup.TableInbox, cleanup.TableOutbox, cleanup.TableSagas} {
		want += `idemd_cleanup_deleted_rows_total{table="` + table + `"} 0` + "\n"
	}
	if err := testutil.GatherAndCompare(m.reg, strings.NewReader(want), "idemd_cleanup_deleted_rows_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(m.reg, "idemd_outbox_parked_total", "idemd_kafka_consumer_lag_failures_total"); err != nil || n != 3 {
		t.Errorf("parked and lag-failure counters: %d series at start (%v); want 3", n, err)
	}
	// The relay's state: 0 until it publishes, 1 while it does.
	active := func(want float64) {
		t.Helper()
		if got := testutil.ToFloat64(m.active); got != want {
			t.Errorf("idemd_outbox_relay_active = %v; want %v", got, want)
		}
	}
	if n, err := testutil.GatherAndCount(m.reg, "idemd_outbox_relay_active"); err != nil || n != 1 {
		t.Errorf("idemd_outbox_relay_active: %d series at start (%v); want 1", n, err)
	}
	active(0)
	m.relayLease(true)
	active(1)
	m.relayLease(false)
	active(0)
}

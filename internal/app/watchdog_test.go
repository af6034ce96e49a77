package app_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/app"
)

// loseEvents installs a trigger that marks the outbox rows matching cond
// (SQL over the new row, NEW.event_type, NEW.record_key) published as they
// are inserted: the relay never sees them, exactly as if the broker had
// acknowledged and then lost them. On PostgreSQL the trigger is on
// outbox_pending (whose rows idem's own trigger writes after each insert
// into outbox): it moves the matching rows to the publication log, once
// per event (lost_event), so that a redrive of the event is not lost too.
func loseEvents(t *testing.T, kind string, exec func(string), cond string) {
	t.Helper()
	if kind == app.Postgres {
		exec(`CREATE TABLE lost_event (id bigint PRIMARY KEY)`)
		exec(`CREATE FUNCTION lose_event() RETURNS trigger LANGUAGE plpgsql AS $$
			DECLARE o outbox;
			BEGIN
				SELECT * INTO o FROM outbox WHERE id = NEW.id;
				IF (` + strings.ReplaceAll(cond, "NEW.", "o.") + `)
					AND NOT EXISTS (SELECT 1 FROM lost_event WHERE id = NEW.id) THEN
					INSERT INTO lost_event (id) VALUES (NEW.id);
					DELETE FROM outbox_pending WHERE id = NEW.id;
					INSERT INTO outbox_published (id, published_at) VALUES (NEW.id, now());
				END IF;
				RETURN NULL;
			END $$`)
		exec(`CREATE TRIGGER lose_event AFTER INSERT ON outbox_pending FOR EACH ROW EXECUTE FUNCTION lose_event()`)
		return
	}
	exec(`CREATE TRIGGER lose_event AFTER INSERT ON outbox WHEN ` + cond + ` BEGIN
		UPDATE outbox SET published_at = CAST(strftime('%s', 'now') AS INTEGER) * 1000000 WHERE id = NEW.id;
	END`)
}

// A lost event does not leave an order CREATED: the watchdog publishes
// the stuck order's events again (same IDs) and the saga finishes, once.
// Order A loses its OrderCreated.v1 (no saga, no projection), order B its
// PaymentCaptured.v1 (charged, never confirmed).
func TestWatchdogRedrivesLostEvents(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dbArg, count := dbCounter(t, kind)
			s := serveOn(t, dbArg, count, "-saga-stuck-after", "1s", "-saga-give-up-after", "1h")
			exec := dbExecer(t, dbArg)
			loseEvents(t, kind, exec, `(NEW.event_type = 'OrderCreated.v1' AND NEW.record_key = '1')
				OR (NEW.event_type = 'PaymentCaptured.v1' AND NEW.record_key = '2')`)
			for _, key := range []string{"a", "b"} {
				if r := s.do(http.MethodPost, "/v1/orders", key, orderBody(7, "10.00")); r.status != http.StatusCreated {
					t.Fatalf("POST: %d %s", r.status, r.body)
				}
			}
			s.waitStatus("1", "CONFIRMED")
			s.waitStatus("2", "CONFIRMED")
			s.waitCount("payment", 2)
			s.waitSummary(7, "orders=2 pending=0 confirmed=2 rejected=0 total_amount=20.0000")
		})
	}
}

// An order whose events are gone for good (removed from the outbox, lost by
// the broker) is given up after -saga-give-up-after: nothing was charged,
// so its saga is aborted and the order REJECTED; the lost event arriving
// after that charges nothing.
func TestWatchdogGivesUpUncharged(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dbArg, count := dbCounter(t, kind)
			s := serveOn(t, dbArg, count, "-saga-stuck-after", "1s", "-saga-give-up-after", "2s")
			exec := dbExecer(t, dbArg)
			// Keep a copy of the event, then lose it for good.
			exec(`CREATE TABLE kept AS SELECT * FROM outbox WHERE 1 = 0`)
			loseEvents(t, kind, exec, `NEW.event_type = 'OrderCreated.v1'`)
			if r := s.do(http.MethodPost, "/v1/orders", "a", orderBody(8, "10.00")); r.status != http.StatusCreated {
				t.Fatalf("POST: %d %s", r.status, r.body)
			}
			exec(`INSERT INTO kept SELECT * FROM outbox`)
			exec(`DELETE FROM outbox`)
			if kind == app.Postgres {
				exec(`DELETE FROM outbox_published`)
			}
			rejected := s.waitStatus("1", "REJECTED")
			if _, ok := rejected["payment_id"]; ok {
				t.Errorf("rejected order has a payment: %v", rejected)
			}
			// The lost event shows up after all (a broker restored from
			// a backup): it must not charge the rejected order.
			exec(`DROP TRIGGER lose_event` + map[bool]string{true: " ON outbox_pending", false: ""}[kind == app.Postgres])
			exec(`INSERT INTO outbox (event_id, event_type, record_key, saga_id, payload, headers, occurred_at, created_at)
				SELECT event_id, event_type, record_key, saga_id, payload, headers, occurred_at, created_at FROM kept`)
			s.waitCount(consumerEvents(app.SagaInbox)+" AND event_id IN (SELECT event_id FROM kept)", 1)
			s.waitCount("customer_order WHERE status = 'REJECTED'", 1)
			if n := s.count("payment"); n != 0 {
				t.Errorf("%d payments after the late event, want 0", n)
			}
			if st := s.do(http.MethodGet, "/v1/orders/1", "", "").json(t)["status"]; st != "REJECTED" {
				t.Errorf("order status %v after the late event, want REJECTED", st)
			}
		})
	}
}

package saga_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/saga"
)

// A saga driven by the events it consumes, across restarts. OrderPlaced
// starts it and runs "reserve", which emits StockReserved; StockReserved
// runs "charge", which emits Charged; Charged runs "ship" and completes the
// saga. The broker is a slice fed by the outbox relay, which publishes every
// event twice (as a relay that died before marking them would). A process is
// a fresh Coordinator, inbox and relay: nothing survives it but the database
// and the consumer's committed offset. Every delivery is first consumed by a
// process that dies before COMMIT, then by one that commits and dies before
// committing the offset, then redelivered to a third, which acknowledges
// it. Each time the saga continues from its last recorded step: every step
// takes effect once, the emitted events have the IDs derived from their
// steps, and the saga completes.
func testResumeDrivenByEvents[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	discard := slog.New(slog.DiscardHandler)
	id := newSagaID(t)
	placed, err := event.New("OrderPlaced.v1", id, map[string]string{"order": id})
	if err != nil {
		t.Fatal(err)
	}
	broker := []event.Envelope{placed} // the topic
	offset := 0                        // the consumer group's committed offset

	type process struct {
		c     *saga.Coordinator[TTx]
		ib    *inbox.Inbox[TTx]
		relay *outbox.Relay[TTx]
	}
	boot := func() *process {
		t.Helper()
		ib, err := inbox.New(f.drv, &inbox.Config{Consumer: "order-saga", Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		pub := outbox.PublisherFunc(func(_ context.Context, evs []event.Envelope) error {
			for _, e := range evs {
				broker = append(broker, e, e)
			}
			return nil
		})
		relay, err := outbox.NewRelay(f.drv, pub, &outbox.RelayConfig{Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		return &process{c: f.coordinator(t, nil), ib: ib, relay: relay}
	}
	// What each event makes the saga do: its step, and the event the step
	// emits ("" for the last step, which completes the saga).
	flow := map[string]struct{ step, emits string }{
		"OrderPlaced.v1":   {"reserve", "StockReserved.v1"},
		"StockReserved.v1": {"charge", "Charged.v1"},
		"Charged.v1":       {"ship", ""},
	}
	// consume is the consumer: the inbox, the saga's step and what it
	// emits, in the transaction tx.
	consume := func(p *process, tx TTx, env event.Envelope) bool {
		t.Helper()
		h, ok := flow[env.Type]
		if !ok {
			t.Fatalf("unexpected event %s", env.Type)
		}
		sagaID := env.Key
		applied, err := p.ib.ProcessTx(ctx, tx, env.ID, func(ctx context.Context, tx TTx) error {
			if env.Type == "OrderPlaced.v1" {
				if _, _, err := p.c.StartTx(ctx, tx, sagaID, "order", env.Payload); err != nil {
					return err
				}
			}
			_, _, err := p.c.StepTx(ctx, tx, sagaID, h.step, func(ctx context.Context, tx TTx) ([]byte, error) {
				if err := f.effect(ctx, tx, sagaID, h.step); err != nil {
					return nil, err
				}
				if h.emits != "" {
					ev, err := event.New(h.emits, sagaID, map[string]string{"after": h.step})
					if err != nil {
						return nil, err
					}
					if _, err := p.c.EmitTx(ctx, tx, sagaID, h.step, "", ev); err != nil {
						return nil, err
					}
				}
				return []byte(h.step + " done"), nil
			})
			if err != nil {
				return err
			}
			if h.emits == "" {
				return p.c.CompleteTx(ctx, tx, sagaID)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("consume %s: %v", env.Type, err)
		}
		return applied
	}

	seen := map[string]bool{}
	p := boot()
	for round := 0; ; round++ {
		if round > 20 {
			t.Fatalf("the saga did not finish: %d events consumed of %d", offset, len(broker))
		}
		if _, err := p.relay.RunOnce(ctx); err != nil {
			t.Fatalf("relay: %v", err)
		}
		if offset == len(broker) {
			break
		}
		env := broker[offset]
		first := !seen[env.ID.String()]
		step := flow[env.Type].step

		// Dies before COMMIT: nothing of the step remains.
		tx := f.begin(t)
		if applied := consume(p, tx, env); applied != first {
			t.Fatalf("%s (first delivery %v): applied = %v", env.Type, first, applied)
		}
		f.rollback(t, tx)
		p = boot()
		if s, err := p.c.Get(ctx, id); first && (err == nil && s.Done(step) || err != nil && !errors.Is(err, saga.ErrNotFound)) {
			t.Fatalf("%s: after a rollback Get = %+v, %v; want step %s not recorded (or, for the first, no saga)", env.Type, s, err, step)
		}

		// Commits, dies before committing the offset.
		tx = f.begin(t)
		if applied := consume(p, tx, env); applied != first {
			t.Fatalf("%s (first delivery %v): applied = %v after a rollback", env.Type, first, applied)
		}
		f.commit(t, tx)
		seen[env.ID.String()] = true
		p = boot()
		if s := mustGet(t, p.c, id); !s.Done(step) {
			t.Fatalf("%s: after the commit the restarted process sees steps %v; want %s done", env.Type, stepNames(s), step)
		}

		// Redelivered to the restarted process: the inbox drops it.
		tx = f.begin(t)
		if consume(p, tx, env) {
			t.Fatalf("%s: a redelivery after the commit was applied", env.Type)
		}
		f.commit(t, tx)
		offset++
	}

	f.mustLog(t, id, "reserve", "charge", "ship")
	s := mustGet(t, p.c, id)
	if s.State != saga.Completed || !slicesEqual(stepNames(s), []string{"reserve", "charge", "ship"}) {
		t.Errorf("saga %s with steps %v; want completed after reserve, charge, ship", s.State, stepNames(s))
	}
	var got []string
	for _, e := range broker[1:] {
		got = append(got, e.Type+" "+e.ID.String())
	}
	reserved := "StockReserved.v1 " + saga.EventID(id, "reserve", "").String()
	charged := "Charged.v1 " + saga.EventID(id, "charge", "").String()
	if want := []string{reserved, reserved, charged, charged}; !slicesEqual(got, want) {
		t.Errorf("the broker got %v; want each saga event (published twice) with the ID derived from its step: %v", got, want)
	}
}

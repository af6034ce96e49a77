package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// isCommit matches a simple-protocol COMMIT (pgx.Tx's, and a *sql.Tx's
// through the pgx stdlib driver).
func isCommit(b []byte) bool {
	return len(b) > 6 && b[0] == 'Q' && bytes.EqualFold(bytes.TrimRight(b[5:], "\x00"), []byte("commit"))
}

// The COMMIT of a round's marks (the claim, the publication and the marks
// are one transaction with these drivers) is black-holed: the round gives
// up within finishTimeout, and the relay publishes the next events on a
// new connection; the event of the lost COMMIT, whose row lock PostgreSQL
// holds until it sees the connection gone, is published again then. Over
// pgsqldriver the COMMIT went out on the transaction's begin context,
// bounded by nothing: the relay published nothing more, and said nothing,
// until TCP gave up.
func TestRelayRecoversFromABlackHoledCommit(t *testing.T) {
	t.Parallel()
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		drv, enq, p := proxiedPostgres(t, 2)
		testRecoversFromABlackHoledCommit(t, drv, enq, p)
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		drv, enq, p := proxiedPostgresSQL(t, 2)
		testRecoversFromABlackHoledCommit[*sql.Tx](t, drv, enq, p)
	})
}

func testRecoversFromABlackHoledCommit[TTx any](t *testing.T, drv, enq driver.OutboxDriver[TTx], p *testdb.Proxy) {
	published := make(chan uuid.UUID, 10)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		NoListen: true, Concurrency: 1, PollInterval: 20 * time.Millisecond,
		OnPublished: func(es []event.Envelope) { // marks committed
			for _, e := range es {
				published <- e.ID
			}
		},
		OnLag:  func(time.Duration) {},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	lost := mustEvent(t, "a")
	f := p.Arm(testdb.BlackHole, isCommit) // the first COMMIT through the proxy: lost's marks
	enqueueTx(t, enq, lost)
	runInBackground(t, relay)
	select {
	case <-f.Fired():
	case <-time.After(10 * time.Second):
		t.Fatal("the marks' COMMIT was not sent")
	}
	next := mustEvent(t, "b")
	enqueueTx(t, enq, next)
	select {
	case id := <-published:
		if id != next.ID {
			t.Fatalf("published %s, want the next event %s (the lost COMMIT's event is locked until its session ends)", id, next.ID)
		}
	case <-time.After(45 * time.Second):
		f.Cut()
		t.Fatal("the relay published nothing within 45s of a COMMIT that PostgreSQL did not answer")
	}
	f.Cut() // PostgreSQL sees the connection gone: the claim's locks go
	select {
	case id := <-published:
		if id != lost.ID {
			t.Fatalf("published %s, want the lost COMMIT's event %s", id, lost.ID)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("the lost COMMIT's event was not published again")
	}
}

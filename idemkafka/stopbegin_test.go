package idemkafka_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
)

// A consumer stopped while its Begin waits for a database connection (the
// application holds every connection of the pool, or the server does not
// answer) returns at once, applies nothing, and commits no offset; the
// records are applied once by the next consumer.
func TestStopWhileBeginWaits(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		testdb.RequirePostgres(t)
		b := setupPostgres(t)
		schema := strings.TrimPrefix(b.env[1], envTarget+"=")
		pool := testdb.Pool(t, schema, 1)
		drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		testStopWhileBeginWaits(t, b, drv, func() func() {
			conn, err := pool.Acquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return conn.Release
		})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		b := setupSQLite(t)
		drv := b.open(t)
		db := drv.(*sqlitedriver.Driver).DB() // one connection
		testStopWhileBeginWaits(t, b, drv, func() func() {
			conn, err := db.Conn(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return func() { _ = conn.Close() }
		})
	})
}

func testStopWhileBeginWaits[TTx any](t *testing.T, b *backend[TTx], drv driver.Driver[TTx], hold func() (release func())) {
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 10, 3)

	release := hold() // every connection is taken before the records come
	in, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	inst := startWith(t, drv, in, consumerConfig(kc, b, "billing", group, nil, topic))
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	time.Sleep(time.Second) // polled; the first Begin waits for a connection

	watch := stallmeter.Start(t) // seconds without CPU are the machine's
	stopped := time.Now()
	inst.cancel()
	select {
	case err := <-inst.done:
		close(inst.done)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		release()
		t.Fatal("Run did not return within 10s of its context ending while Begin waited")
	}
	took, stalled := time.Since(stopped), watch.Stop()
	release()
	if took > 3*time.Second+stalled {
		t.Errorf("Run returned %s after its context ended (the process stalled %s); want at once", took, stalled)
	}
	if n := len(b.rows(t, "billing")); n != 0 {
		t.Fatalf("%d effects applied while no connection was free; want 0", n)
	}
	if got := kc.Committed(t, group, topic); len(got) > 0 && got[0] > 0 {
		t.Fatalf("offset %d committed; want none", got[0])
	}

	again := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, again)
	mustOnce(t, b, "billing", evs)
}

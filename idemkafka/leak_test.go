package idemkafka_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
)

// settledGoroutines waits (up to 20s) for the goroutine count to drop to at
// most limit and returns the count then.
func settledGoroutines(limit int) int {
	deadline := time.Now().Add(20 * time.Second)
	for {
		runtime.GC()
		n := runtime.NumGoroutine()
		if n <= limit || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// steadyGoroutines waits until the goroutine count has not dropped for a
// second (up to 20s) and returns the lowest count seen: the baseline once
// the background goroutines of the runs before ended. (Waiting for it to
// drop to 0 cost the whole 20s in every run, the package's tests held
// behind this one.)
func steadyGoroutines() int {
	deadline := time.Now().Add(20 * time.Second)
	low, since := -1, time.Now()
	for {
		runtime.GC()
		if n := runtime.NumGoroutine(); low < 0 || n < low {
			low, since = n, time.Now()
		}
		if time.Since(since) >= time.Second || time.Now().After(deadline) {
			return low
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func goroutineDump() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// One Consumer run and stopped many times, each run starting on a pool
// whose sessions the database ended (a restart), applying an event and
// failing another a few times on a handler fault (rewound, backed off):
// neither goroutines nor the pool's connections pile up over the runs.
// Not parallel: it counts the process's goroutines.
func TestConsumerRunsDoNotLeak(t *testing.T) {
	testdb.RequirePostgres(t)
	admin, schema := testdb.Schema(t, 1)
	b := postgresAt(t, schema, true)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 2)
	app := "consumerleak-" + schema
	pool := testdb.PoolParams(t, schema, 4, map[string]string{"application_name": app})
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var fails atomic.Int32
	cfg := consumerConfig(kc, b, "billing", group, func(e event.Envelope) error {
		if strings.HasPrefix(e.Key, "bad") && fails.Add(1)%4 != 0 {
			return errors.New("transient")
		}
		return nil
	}, topic)
	cfg.Retry = idemkafka.Retry{Attempts: 1, Backoff: func(int) time.Duration { return 5 * time.Millisecond }}
	c, err := idemkafka.NewConsumer(in, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	cycle := func(i int) {
		evs := newEvents(t, 2, 2)
		evs[1].Key = "bad-" + evs[1].Key
		kc.Produce(t, topic, recordsOf(topic, evs...)...)
		// The database restarted since the last run: the pool's
		// sessions are gone.
		if _, err := admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		waitFor(t, 30*time.Second, "the records committed", func() bool { return allCommitted(t, kc, group, topic) })
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("run %d: %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("run %d did not stop", i)
		}
	}
	for i := range 3 { // warm up: kfake, the pool, kgo's and pgx's background goroutines
		cycle(i)
	}
	before := steadyGoroutines()
	beforeConns := pool.Stat().AcquiredConns()
	const runs = 12
	for i := range runs {
		cycle(i)
	}
	after := settledGoroutines(before + 5)
	if after > before+5 {
		t.Errorf("%d goroutines after %d more runs, %d before:\n%s", after, runs, before, goroutineDump())
	}
	if n := pool.Stat().AcquiredConns(); n > beforeConns {
		t.Errorf("%d connections acquired after the runs, %d before", n, beforeConns)
	}
	t.Logf("goroutines %d -> %d over %d runs; acquired conns %d", before, after, runs, pool.Stat().AcquiredConns())
}

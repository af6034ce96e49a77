package main_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

// embeddedLease is the length of the embedded broker's lease (table
// idem_lock, app.EmbeddedLock): an idemd on another host takes it over
// once it expired.
const embeddedLease = 15 * time.Second

// pauseFor is how long TestE2EPause freezes a replica: past its consumers'
// session timeout and the rebalance that hands its partitions to the other
// replica (app.ConsumerSessionTimeout + app.ConsumerRebalanceTimeout), and
// past the load clients' request timeout (15 s), so that the requests it
// was serving are retried on the other replica while it still holds them.
const pauseFor = 20 * time.Second

// TestE2EPause freezes one of two idemd replicas sharing PostgreSQL and a
// Kafka cluster with SIGSTOP in the middle of the load, as a long GC or
// memory-pressure stall, a VM live migration or a CPU quota would, and
// resumes it with SIGCONT after pauseFor: unlike a killed replica, the
// frozen one keeps its connections, its open transactions and locks, its
// claims of outbox rows and its offsets to commit, and wakes up believing it
// still owns its partitions. The other replica meanwhile takes its
// partitions and the clients that gave up on it. Once the load is answered
// it checks the invariants of TestE2E (each order once, one payment per
// CONFIRMED order, summaries right, no replica exited by itself), that
// every outbox event reached the topic and each consumer applied it once,
// that no consumer group's committed offset ever moved back (read every
// 200 ms throughout), and that no order stayed CREATED.
func TestE2EPause(t *testing.T) {
	t.Parallel()
	idemdBinary(t)
	n := e2eOrders(150)
	db := newPGDatabase(t) // before the cluster: dropped after its processes are gone
	c := newCluster(t)
	c.ownGroups = true
	kc := kafkatest.New(t)
	topic := kafkatest.Name("idemd-pause")
	kc.CreateTopic(t, topic, 3)
	kc.CreateTopic(t, topic+".dlq", 1)
	addrs := []string{freeAddr(t), freeAddr(t)}
	names := []string{"replica-a", "replica-b"}
	var replicas [2]*proc
	for i := range replicas { // one after the other: the first migrates
		args := append(commonArgs(addrs[i], db.url.String()), "-kafka", strings.Join(kc.Seeds, ","), "-kafka-topic", topic)
		replicas[i] = c.mustStart(t, names[i], args...)
	}
	victim := replicas[0]
	// A test that fails while the victim is stopped must not leave it so:
	// the cluster's cleanup kills it (SIGKILL ends a stopped process), and
	// a SIGCONT first is harmless.
	t.Cleanup(func() { _ = victim.cmd.Process.Signal(syscall.SIGCONT) })

	mon := watchOffsets(kc.Admin(), topic, app.ProjectionGroup, app.SagaGroup)
	defer mon.stop()

	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout(n, 1)+pauseFor)
	defer cancel()
	orders := makeOrders(n, e2eCustomers)
	plan := newKillPlan(n, 1, e2eClients)
	l := &load{
		orders:  orders,
		clients: e2eClients,
		base:    "http://" + addrs[0], // the host is the failover's
		transport: func(i int) http.RoundTripper {
			tr := http.DefaultTransport.(*http.Transport).Clone()
			return &failover{rt: tr, hosts: []string{addrs[i%2], addrs[(i+1)%2]}}
		},
		onAnswer: plan.answered,
		gate:     plan.gate,
	}
	kctx, stopPause := context.WithCancel(ctx)
	defer stopPause()
	var (
		ctl     sync.WaitGroup
		resumed time.Time
	)
	ctl.Go(func() {
		plan.each(kctx, l, func(int) bool {
			if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Errorf("SIGSTOP %s: %v", victim.name, err)
				return false
			}
			stopped := time.Now()
			sleepCtx(ctx, pauseFor)
			during := l.answered.Load() - plan.last()
			if err := victim.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT %s: %v", victim.name, err)
				return false
			}
			resumed = time.Now()
			t.Logf("%s stopped for %.1f s at %d of %d orders answered; %d orders answered meanwhile (by %s)",
				victim.name, resumed.Sub(stopped).Seconds(), plan.last(), n, during, replicas[1].name)
			if during <= 0 {
				t.Errorf("no order answered while %s was stopped: the other replica should serve alone", victim.name)
			}
			if j, ok := assignedAfter(replicas[1].stderr.String(), stopped); ok {
				t.Logf("%s's consumers were assigned %.1f s after the SIGSTOP", replicas[1].name, j.Seconds())
			}
			return true
		})
	})
	loadStart := time.Now()
	l.run(ctx)
	stopPause()
	ctl.Wait()
	t.Logf("load: %d of %d orders answered in %.1f s", l.answered.Load(), n, time.Since(loadStart).Seconds())
	plan.check(t, n, l.answered.Load())

	live := func() string { return replicas[1].base }
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	replay(rctx, live(), orders)
	rcancel()
	awaitInvariants(t, expectation{
		orders:    orders,
		customers: e2eCustomers,
		state:     db.state,
		base:      live,
		exits:     c.unexpectedExits,
		pipeline:  &pipeline{db: db, seeds: kc.Seeds, topic: topic, procs: func() []*proc { return replicas[:] }},
	}, quiescence(n))
	awaitOutboxDrained(t, db, 30*time.Second)
	events, records := checkPublished(t, db, kc, topic)
	checkInboxes(t, db, replicas[:], events, records)
	mon.stop()
	for _, m := range mon.backwards() {
		t.Errorf("committed offset moved back: %s", m)
	}
	t.Logf("committed offsets read %d times, never moved back: %v", mon.reads(), mon.last())
	if !resumed.IsZero() {
		t.Logf("%s's warnings and errors after the SIGCONT: %s", victim.name, warnings(victim, resumed))
	}
}

// warnings lists p's WARN and ERROR lines logged since since (the time in
// their time= attribute), or "none".
func warnings(p *proc, since time.Time) string {
	var out []string
	for line := range strings.SplitSeq(p.stderr.String(), "\n") {
		if !strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=ERROR") {
			continue
		}
		if at, ok := logTime(line); ok && at.Before(since) {
			continue
		}
		out = append(out, clip(line, 300))
	}
	if len(out) == 0 {
		return "none"
	}
	return "\n" + strings.Join(out, "\n")
}

// logTime reads the time= attribute of a log line.
func logTime(line string) (time.Time, bool) {
	_, rest, ok := strings.Cut(line, "time=")
	if !ok {
		return time.Time{}, false
	}
	v, _, _ := strings.Cut(rest, " ")
	at, err := time.Parse(time.RFC3339Nano, strings.Trim(v, `"`))
	return at, err == nil
}

// offsetWatch reads the committed offsets of groups on topic every 200 ms
// and remembers every one that moved back.
type offsetWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	seen   map[string]int64 // group/partition: the highest offset read
	back   []string
	n      int
}

func watchOffsets(adm *kadm.Client, topic string, groups ...string) *offsetWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &offsetWatch{cancel: cancel, done: make(chan struct{}), seen: map[string]int64{}}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			for _, g := range groups {
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				offs, err := adm.FetchOffsets(rctx, g)
				rcancel()
				if err != nil {
					continue // not yet created, or the broker is busy: the next read
				}
				w.mu.Lock()
				w.n++
				for p, o := range offs[topic] {
					if o.Err != nil || o.At < 0 {
						continue
					}
					k := fmt.Sprintf("%s/%d", g, p)
					if prev, ok := w.seen[k]; ok && o.At < prev {
						w.back = append(w.back, fmt.Sprintf("%s: %d after %d", k, o.At, prev))
					}
					w.seen[k] = max(w.seen[k], o.At)
				}
				w.mu.Unlock()
			}
			sleepCtx(ctx, 200*time.Millisecond)
		}
	}()
	return w
}

func (w *offsetWatch) stop() { w.cancel(); <-w.done }

func (w *offsetWatch) backwards() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.back...)
}

func (w *offsetWatch) reads() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func (w *offsetWatch) last() map[string]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int64, len(w.seen))
	for k, v := range w.seen {
		out[k] = v
	}
	return out
}

// TestE2EPauseEmbedded freezes the one idemd that runs the embedded broker
// of a database (the broker, its consumers and its relay freeze with it)
// for pauseFor in the middle of the load, then resumes it: nobody can
// take over its lease on its own host (its process is alive), so it must
// simply go on, with the invariants of TestE2E and the outbox drained.
func TestE2EPauseEmbedded(t *testing.T) {
	t.Parallel()
	idemdBinary(t)
	if !hasFlag(t, "kafka-dir") || !hasFlag(t, "kafka-embedded-addr") {
		t.Skip("idemd has no -kafka-dir or -kafka-embedded-addr")
	}
	n := e2eOrders(120)
	db := newPGDatabase(t) // before the cluster: dropped after its processes are gone
	c := newCluster(t)
	c.ownGroups = true
	addr, embedded := freeAddr(t), freeAddr(t)
	args := append(commonArgs(addr, db.url.String()), "-kafka-dir", t.TempDir(), "-kafka-embedded-addr", embedded)
	p := c.mustStart(t, "idemd", args...)
	t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })

	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout(n, 1)+pauseFor)
	defer cancel()
	orders := makeOrders(n, e2eCustomers)
	plan := newKillPlan(n, 1, e2eClients)
	l := &load{orders: orders, clients: e2eClients, base: "http://" + addr, onAnswer: plan.answered, gate: plan.gate}
	kctx, stopPause := context.WithCancel(ctx)
	defer stopPause()
	var (
		ctl     sync.WaitGroup
		resumed time.Time
	)
	ctl.Go(func() {
		plan.each(kctx, l, func(int) bool {
			if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Errorf("SIGSTOP: %v", err)
				return false
			}
			sleepCtx(ctx, pauseFor)
			if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT: %v", err)
				return false
			}
			resumed = time.Now()
			t.Logf("stopped for %v at %d of %d orders answered", pauseFor, plan.last(), n)
			return true
		})
	})
	loadStart := time.Now()
	l.run(ctx)
	stopPause()
	ctl.Wait()
	t.Logf("load: %d of %d orders answered in %.1f s", l.answered.Load(), n, time.Since(loadStart).Seconds())
	plan.check(t, n, l.answered.Load())
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	replay(rctx, p.base, orders)
	rcancel()
	awaitInvariants(t, expectation{
		orders:    orders,
		customers: e2eCustomers,
		state:     db.state,
		base:      func() string { return p.base },
		exits:     c.unexpectedExits,
		pipeline: &pipeline{db: db, seeds: []string{embedded}, topic: app.DefaultKafkaTopic,
			procs: func() []*proc { return []*proc{p} }},
	}, quiescence(n))
	awaitOutboxDrained(t, db, 30*time.Second)
	if !resumed.IsZero() {
		t.Logf("warnings and errors after the SIGCONT: %s", warnings(p, resumed))
	}
}

// TestE2EPauseEmbeddedTakeover freezes the one idemd that runs the
// embedded broker of a database for longer than its lease (15 s) and,
// while it is frozen, takes the lease as an idemd started on another host
// does once it expired (that one then redrives the outbox into its own
// log, a different one), and enqueues events as that idemd's requests
// would. The resumed one must stop (exit 1) and mark none of them
// published: it would have published them into a log no consumer reads any
// more, and the outbox would say they were delivered.
func TestE2EPauseEmbeddedTakeover(t *testing.T) {
	t.Parallel()
	idemdBinary(t)
	if !hasFlag(t, "kafka-dir") || !hasFlag(t, "kafka-embedded-addr") {
		t.Skip("idemd has no -kafka-dir or -kafka-embedded-addr")
	}
	db := newPGDatabase(t) // before the cluster: dropped after its processes are gone
	c := newCluster(t)
	c.ownGroups = true
	addr, embedded := freeAddr(t), freeAddr(t)
	args := append(commonArgs(addr, db.url.String()), "-kafka-dir", t.TempDir(), "-kafka-embedded-addr", embedded)
	p := c.mustStart(t, "idemd", args...)
	t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })

	// A few orders through the whole pipeline first.
	const n = 10
	orders := makeOrders(n, 3)
	lctx, lcancel := context.WithTimeout(context.Background(), 60*time.Second)
	l := &load{orders: orders, clients: 2, base: p.base}
	l.run(lctx)
	lcancel()
	awaitInvariants(t, expectation{
		orders:    orders,
		customers: 3,
		state:     db.state,
		base:      func() string { return p.base },
		exits:     c.unexpectedExits,
		pipeline: &pipeline{db: db, seeds: []string{embedded}, topic: app.DefaultKafkaTopic,
			procs: func() []*proc { return []*proc{p} }},
	}, quiescence(n))
	if t.Failed() {
		return
	}
	drv, err := pgdriver.New(db.pool, &pgdriver.Config{})
	if err != nil {
		t.Fatal(err)
	}

	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	// Frozen past its lease: only then may an idemd elsewhere take it.
	time.Sleep(embeddedLease + 2*time.Second)
	bctx, bcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer bcancel()
	now := time.Now()
	ok, err := drv.Executor().LockAcquire(bctx, &driver.LockAcquireParams{Name: app.EmbeddedLock, Owner: "elsewhere/1/00000000/pid:[1]", Now: now, Until: now.Add(time.Hour)})
	if err != nil || !ok {
		t.Fatalf("take the expired embedded broker's lease over: %v (taken: %v)", err, ok)
	}
	const later = 40
	tx, err := drv.Begin(bctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range later {
		e, err := event.New("PauseProbe.v1", fmt.Sprintf("probe-%d", i), map[string]int{"i": i})
		if err == nil {
			err = outbox.EnqueueTx(bctx, drv, tx, e)
		}
		if err != nil {
			_ = drv.Rollback(bctx, tx)
			t.Fatalf("enqueue: %v", err)
		}
	}
	if err := drv.Commit(bctx, tx); err != nil {
		t.Fatal(err)
	}
	took := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30 s after its lease was taken over and it resumed")
	}
	p.stopping.Store(true) // expected: not an unexpected exit
	var marked int
	if err := db.pool.QueryRow(bctx, `SELECT count(*) FROM outbox_published JOIN outbox USING (id) WHERE record_key LIKE 'probe-%'`).Scan(&marked); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the takeover: %s; %d of the %d events enqueued meanwhile marked published by it", p.exitString(), marked, later)
	if marked > 0 {
		t.Errorf("the resumed idemd marked %d events published after another idemd took its embedded broker's lease: they went into a log no consumer reads, and the new broker never gets them", marked)
	}
	t.Logf("its warnings and errors after the SIGCONT: %s", warnings(p, took))
	if !strings.Contains(p.stderr.String(), "lease taken") {
		t.Errorf("no line says the lease was taken: %s", warnings(p, took))
	}
}

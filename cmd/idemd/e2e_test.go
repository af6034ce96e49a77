package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
)

// Parameters of the scenarios (see e2eOrders and e2eKills for the soak).
const (
	e2eClients   = 20
	e2eCustomers = 10
	// failoverLimit bounds the replica scenario's failover in the soak
	// (IDEM_E2E_SOAK=1), and in every run the time until the dead
	// replica's partitions were assigned to the survivor; the target is
	// 10 s.
	failoverLimit = 20 * time.Second
	// staticSession is the session timeout of the replicas that are
	// static members: longer than a restart under load takes.
	staticSession = 30 * time.Second
	outage        = 10 * time.Second
)

// TestE2E runs the real idemd binary under load and breaks it: restarts
// (SIGTERM, SIGKILL) on PostgreSQL with the embedded broker and on SQLite,
// the kill of one of two replicas sharing PostgreSQL and a Kafka cluster
// (dynamic members, and static ones restarted at once), PostgreSQL
// unreachable for 10 s, and the Kafka cluster of two replicas unreachable
// for 10 s. After each, once the load is answered, it waits for the
// invariants (for quiescence, then on, up to three times as long, while
// orders keep settling: a busy machine drains the backlog slower, a stalled
// pipeline not at all; a failure describes where the events are):
// every order answered 201 with one id per key, as many orders
// as operations, each CONFIRMED (amount <= 10000) or REJECTED, one payment
// per CONFIRMED order and none otherwise, the customers' summaries
// agreeing with the orders, and no idemd exited by itself. After the Kafka
// outage it also checks that orders were answered during it, that the
// outbox is drained (none pending, none parked), that every outbox event is
// in the topic and none was dead-lettered, that the consumers applied each
// event once and dropped its copies, and logs the time from the broker's
// return until the backlog settled.
//
// IDEM_E2E_SOAK=1 (or -e2e.orders, -e2e.kills) runs a longer soak, whose
// first Kafka outage outlasts the relay's publish timeout (30 s) and
// the hold timeout of its claims (50 s): 60 s, or -e2e.long-outage.
func TestE2E(t *testing.T) {
	t.Parallel()
	idemdBinary(t)
	scenarios := []struct {
		name string
		run  func(*testing.T)
	}{
		{"postgres/SIGTERM", func(t *testing.T) { restartScenario(t, "postgres", syscall.SIGTERM, e2eOrders(300)) }},
		{"postgres/SIGKILL", func(t *testing.T) { restartScenario(t, "postgres", syscall.SIGKILL, e2eOrders(300)) }},
		// 150 orders, in the soak too (which kills it 5 times): the soak
		// runs every scenario at once on 2 cores, and 1,500 orders through
		// PgBouncer's extra hop (no prepared statements) starved the
		// others and itself (-e2e.orders 1500 -e2e.kills 5 alone: settled
		// 10.6 s after the load).
		{"pgbouncer/SIGKILL", func(t *testing.T) { restartScenario(t, "pgbouncer", syscall.SIGKILL, pgbouncerOrders()) }},
		{"sqlite/SIGTERM", func(t *testing.T) { restartScenario(t, "sqlite", syscall.SIGTERM, e2eOrders(150)) }},
		{"sqlite/SIGKILL", func(t *testing.T) { restartScenario(t, "sqlite", syscall.SIGKILL, e2eOrders(150)) }},
		{"postgres/replicas/SIGKILL", func(t *testing.T) { replicaScenario(t, e2eOrders(300), false) }},
		{"postgres/replicas-static/SIGKILL", func(t *testing.T) { replicaScenario(t, e2eOrders(300), true) }},
		{"postgres/unreachable", func(t *testing.T) { outageScenario(t, e2eOrders(300)) }},
		{"postgres/kafka-unreachable", func(t *testing.T) { kafkaOutageScenario(t, e2eOrders(300)) }},
	}
	// The scenarios run at once, but not through t.Parallel: -parallel
	// defaults to GOMAXPROCS, which on 2 cores would run them two by two,
	// while they mostly wait (for restarts, outages, the pipeline).
	var wg sync.WaitGroup
	for _, s := range scenarios {
		wg.Go(func() { t.Run(s.name, s.run) })
	}
	wg.Wait()
}

// pgbouncerOrders is the pgbouncer scenario's load: -e2e.orders, or 150.
func pgbouncerOrders() int {
	if *e2eOrdersFlag > 0 {
		return *e2eOrdersFlag
	}
	return 150
}

// restartScenario sends n orders to one idemd on a fresh database (kind
// "postgres", with the embedded broker's log in a -kafka-dir; "pgbouncer",
// the same through PgBouncer in transaction mode, the relay LISTENing on a
// direct connection (-db-listen); or "sqlite")
// and stops it with sig at the kill points, restarting it each time on the
// same address, database and broker log.
func restartScenario(t *testing.T, kind string, sig syscall.Signal, n int) {
	var (
		db      *pgDatabase
		bouncer string
	)
	if kind == "postgres" || kind == "pgbouncer" {
		db = newPGDatabase(t) // before the cluster: dropped after its processes are gone
	}
	if kind == "pgbouncer" {
		bouncer = testdb.PgBouncer(t) // stopped after idemd (cleanups run last first)
	}
	c := newCluster(t)
	addr := freeAddr(t)
	var (
		args     []string
		state    stateReader
		embedded string // the embedded broker's address, when set
	)
	switch kind {
	case "postgres", "pgbouncer":
		args, state = commonArgs(addr, db.url.String()), db.state
		if kind == "pgbouncer" {
			u, err := url.Parse(bouncer)
			if err != nil {
				t.Fatal(err)
			}
			u.Path = "/" + db.name
			u.RawQuery = "sslmode=disable&default_query_exec_mode=cache_describe" // PgBouncer 1.18 keeps no prepared statement
			args = append(commonArgs(addr, u.String()), "-db-listen", db.url.String())
		}
		if hasFlag(t, "kafka-dir") {
			args = append(args, "-kafka-dir", t.TempDir())
		} else {
			t.Errorf("idemd has no -kafka-dir flag: the embedded broker keeps its log in memory and loses it on restart; running without it")
		}
		if hasFlag(t, "kafka-embedded-addr") {
			embedded = freeAddr(t)
			args = append(args, "-kafka-embedded-addr", embedded)
		}
	case "sqlite":
		path := filepath.Join(t.TempDir(), "idemd.db")
		args, state = commonArgs(addr, "sqlite:"+path), sqliteState(path) // the broker's log: PATH.kafka
	}
	var cur atomic.Pointer[proc]
	cur.Store(c.mustStart(t, "idemd", args...))

	kills := e2eKills()
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout(n, kills))
	defer cancel()
	orders := makeOrders(n, e2eCustomers)
	plan := newKillPlan(n, kills, e2eClients)
	l := &load{orders: orders, clients: e2eClients, base: "http://" + addr, onAnswer: plan.answered, gate: plan.gate}
	kctx, stopKills := context.WithCancel(ctx) // no kill after the load
	defer stopKills()
	var restarts sync.WaitGroup
	restarts.Go(func() {
		plan.each(kctx, l, func(int) bool {
			start := time.Now()
			if err := cur.Load().stop(sig, 40*time.Second); err != nil {
				t.Errorf("stop: %v", err)
			}
			stopped := time.Since(start)
			p, err := c.start("idemd", args...)
			if err != nil {
				t.Errorf("restart: %v", err)
				cancel()
				return false
			}
			cur.Store(p)
			t.Logf("%v at %d of %d orders answered: stopped in %.1f s, listening again after %.1f s",
				sig, plan.last(), n, stopped.Seconds(), time.Since(start).Seconds())
			return true
		})
	})
	loadStart := time.Now()
	l.run(ctx)
	stopKills()
	restarts.Wait()
	t.Logf("load: %d of %d orders answered in %.1f s", l.answered.Load(), n, time.Since(loadStart).Seconds())
	plan.check(t, n, l.answered.Load())

	if cur.Load().running() { // else the restart failed: reported
		rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
		replay(rctx, "http://"+addr, orders)
		rcancel()
	}
	awaitInvariants(t, expectation{
		orders:    orders,
		customers: e2eCustomers,
		state:     state,
		base:      func() string { return cur.Load().base },
		exits:     c.unexpectedExits,
		pipeline: &pipeline{db: db, seeds: nonEmpty(embedded), topic: app.DefaultKafkaTopic,
			procs: func() []*proc { return []*proc{cur.Load()} }},
	}, quiescence(n))
}

// replicaScenario runs two idemd replicas on one PostgreSQL and a Kafka
// cluster of the test; half the clients prefer each, and move to the other
// on a connection error. It SIGKILLs a replica at each kill point and
// measures the failover: from the kill until every order answered before
// it is CONFIRMED or REJECTED. A killed replica is restarted (once its
// failover is measured) only when more kills follow.
//
// With static, each replica has its own -kafka-instance-id (and a 30 s
// session) and a killed one is restarted at once, as a StatefulSet would:
// it takes its partitions back when it rejoins, before its session expires.
func replicaScenario(t *testing.T, n int, static bool) {
	db := newPGDatabase(t) // before the cluster: dropped after its processes are gone
	c := newCluster(t)
	kc := kafkatest.New(t)
	topic := kafkatest.Name("idemd-e2e")
	kc.CreateTopic(t, topic, 3)
	kc.CreateTopic(t, topic+".dlq", 1)
	addrs := []string{freeAddr(t), freeAddr(t)}
	names := []string{"replica-a", "replica-b"}
	argsOf := func(i int) []string {
		args := append(commonArgs(addrs[i], db.url.String()), "-kafka", strings.Join(kc.Seeds, ","), "-kafka-topic", topic)
		if static {
			args = append(args, "-kafka-instance-id", names[i], "-kafka-session-timeout", staticSession.String())
		}
		return args
	}
	var replicas [2]atomic.Pointer[proc]
	for i := range replicas { // one after the other: the first migrates
		replicas[i].Store(c.mustStart(t, names[i], argsOf(i)...))
	}
	live := func() string {
		for i := range replicas {
			if p := replicas[i].Load(); p.running() {
				return p.base
			}
		}
		return "http://" + addrs[0]
	}

	kills := e2eKills()
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout(n, kills))
	defer cancel()
	orders := makeOrders(n, e2eCustomers)
	plan := newKillPlan(n, kills, e2eClients)
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
	kctx, stopKills := context.WithCancel(ctx) // no kill after the load
	defer stopKills()
	var ctl sync.WaitGroup
	ctl.Go(func() {
		plan.each(kctx, l, func(k int) bool {
			victim := k % 2
			killed := time.Now()
			if err := replicas[victim].Load().stop(syscall.SIGKILL, 10*time.Second); err != nil {
				t.Errorf("kill: %v", err)
			}
			restart := func() bool {
				p, err := c.start(names[victim], argsOf(victim)...)
				if err != nil {
					t.Errorf("restart: %v", err)
					cancel()
					return false
				}
				replicas[victim].Store(p)
				return true
			}
			if static && !restart() {
				return false
			}
			listening := time.Since(killed)
			before := answeredBy(orders, killed)
			d, left := settle(db, before, killed, 60*time.Second)
			if left > 0 {
				p := &pipeline{db: db, seeds: kc.Seeds, topic: topic,
					procs: func() []*proc { return []*proc{replicas[0].Load(), replicas[1].Load()} }}
				t.Errorf("failover: > %.0f s: %d of the %d orders answered before the SIGKILL of %s are still CREATED\n%s",
					d.Seconds(), left, len(before), names[victim], p.describe(context.Background()))
			} else {
				how := "its partitions moved to the other replica"
				if static {
					how = fmt.Sprintf("restarted at once, a static member: listening again %.1f s after the kill", listening.Seconds())
				}
				var (
					assigned   time.Duration
					assignedOK bool
				)
				if !static {
					// Where the time went: until the survivor's consumers
					// took the dead replica's partitions (its session
					// timeout, then a rebalance), then the backlog.
					assigned, assignedOK = assignedAfter(replicas[1-victim].Load().stderr.String(), killed)
					if assignedOK {
						how += fmt.Sprintf(", assigned to %s %.1f s after the kill", names[1-victim], assigned.Seconds())
					}
				}
				t.Logf("failover: %.1f s (SIGKILL of %s at %d of %d orders answered; %d orders to settle; %s)",
					d.Seconds(), names[victim], plan.last(), n, len(before), how)
				// The failover's whole time counts the backlog the
				// survivor settles, at the speed the machine gives it:
				// 6.2-11.3 s on a quiet one, 20-40 s with the whole
				// suite on this machine's 2 cores, where the partitions
				// still moved after 6-8 s. So the bound on the whole is
				// checked in the soak (IDEM_E2E_SOAK=1, on a quiet
				// machine); the other runs bound what the failover
				// itself takes, which a loaded machine does not
				// stretch: the dead replica's partitions assigned to the
				// survivor (its session timeout, then a rebalance), or
				// the static member's rejoin below; a failover that
				// does not happen is the 60 s above.
				switch {
				case d > failoverLimit && e2eSoak():
					t.Errorf("failover took %.1f s, more than %v (target 10 s)", d.Seconds(), failoverLimit)
				case d > failoverLimit:
					t.Logf("the failover took more than the %v a quiet machine gives it (checked with IDEM_E2E_SOAK=1): this machine settled the backlog slowly", failoverLimit)
				}
				if !static && !assignedOK {
					t.Errorf("failover: the orders settled %.1f s after the SIGKILL of %s, but the log of %s shows no partitions assigned to it since: did its partitions move?",
						d.Seconds(), names[victim], names[1-victim])
				} else if !static && assigned > failoverLimit {
					t.Errorf("failover: the dead replica's partitions were assigned to %s %.1f s after the SIGKILL of %s, more than %v (its session timeout is %v)",
						names[1-victim], assigned.Seconds(), names[victim], failoverLimit, app.ConsumerSessionTimeout)
				}
				// A dynamic member restarted at once joins as a new
				// member: the rebalance waits for the dead one until the
				// rebalance timeout (10 s; measured 10.8 s with the
				// instance IDs left out). A static member takes its
				// partitions back as soon as it rejoins (1.0-2.0 s). Not
				// checked in the soak, where the backlog to settle after
				// a kill is larger.
				// The settle time alone also counts the restart and the
				// backlog, which on a loaded machine took 11 s with the
				// partitions taken back at once: over the timeout, the
				// restarted replica's log decides (from its consumers'
				// start to their assignment).
				// Its log is read until each consumer's assignment shows
				// (or 30 s): the orders may settle before it, read at once
				// it failed a CI run.
				if static && !e2eSoak() && d >= app.ConsumerRebalanceTimeout {
					join, ok := awaitRejoin(replicas[victim].Load(), 30*time.Second)
					switch {
					case !ok:
						t.Errorf("failover of a static member restarted at once took %.1f s, and its log shows no assignment for each consumer", d.Seconds())
					case join >= app.ConsumerRebalanceTimeout:
						t.Errorf("failover of a static member restarted at once took %.1f s, its consumers assigned %.1f s after they started, not under the %v rebalance timeout: it did not take its partitions back",
							d.Seconds(), join.Seconds(), app.ConsumerRebalanceTimeout)
					default:
						t.Logf("the restarted static member's consumers were assigned %.1f s after they started", join.Seconds())
					}
				}
			}
			if static || k == len(plan.points)-1 {
				return true
			}
			return restart()
		})
	})
	loadStart := time.Now()
	l.run(ctx)
	stopKills()
	ctl.Wait()
	t.Logf("load: %d of %d orders answered in %.1f s", l.answered.Load(), n, time.Since(loadStart).Seconds())
	plan.check(t, n, l.answered.Load())

	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	replay(rctx, live(), orders)
	rcancel()
	awaitInvariants(t, expectation{
		orders:    orders,
		customers: e2eCustomers,
		state:     db.state,
		base:      live,
		exits:     c.unexpectedExits,
		pipeline: &pipeline{db: db, seeds: kc.Seeds, topic: topic,
			procs: func() []*proc { return []*proc{replicas[0].Load(), replicas[1].Load()} }},
	}, quiescence(n))
}

// settle waits (up to within) until none of the orders ids is CREATED any
// more; it returns the time since from and how many are still CREATED.
func settle(db *pgDatabase, ids []int64, from time.Time, within time.Duration) (time.Duration, int) {
	ctx, cancel := context.WithTimeout(context.Background(), within+10*time.Second)
	defer cancel()
	left := len(ids)
	for {
		var n int
		err := db.pool.QueryRow(ctx, `SELECT count(*) FROM customer_order WHERE id = ANY($1) AND status NOT IN ('CONFIRMED', 'REJECTED')`, ids).Scan(&n)
		if err == nil {
			left = n
			if n == 0 {
				return time.Since(from), 0
			}
		}
		if time.Since(from) > within {
			return time.Since(from), left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// outageScenario runs one idemd on PostgreSQL through a TCP proxy of the
// test, and at each kill point cuts PostgreSQL off for 10 s: every
// proxied connection closed, new ones refused; then restores it.
func outageScenario(t *testing.T, n int) {
	db := newPGDatabase(t) // before the cluster: dropped after its processes are gone
	c := newCluster(t)
	px := newPGProxy(t, db.url.Host)
	// Migrated first, directly (idemd migrate up, unbounded): migrating
	// at start counts in idemd's 30 s start-up bound, and with every
	// scenario migrating at once on a loaded machine, through the
	// proxy of this (busy) test process, it once ran past it. The other
	// PostgreSQL scenarios migrate at start; this one is about the
	// outage.
	mctx, mcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	out, err := exec.CommandContext(mctx, idemdBinary(t), "migrate", "up", "-db", db.url.String()).CombinedOutput()
	mcancel()
	if err != nil {
		t.Fatalf("idemd migrate up: %v\n%s", err, out)
	}
	addr := freeAddr(t)
	args := commonArgs(addr, db.via(px.addr))
	if hasFlag(t, "kafka-dir") {
		args = append(args, "-kafka-dir", t.TempDir())
	}
	p := c.mustStart(t, "idemd", args...)

	kills := e2eKills()
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout(n, kills)+time.Duration(kills)*outage)
	defer cancel()
	orders := makeOrders(n, e2eCustomers)
	plan := newKillPlan(n, kills, e2eClients)
	l := &load{orders: orders, clients: e2eClients, base: p.base, onAnswer: plan.answered, gate: plan.gate}
	kctx, stopKills := context.WithCancel(ctx) // no kill after the load
	defer stopKills()
	var ctl sync.WaitGroup
	ctl.Go(func() {
		plan.each(kctx, l, func(int) bool {
			cut := px.cut()
			if cut == 0 {
				t.Errorf("harness: the proxy had no connection to cut")
			}
			sleepCtx(ctx, outage)
			if err := px.restore(); err != nil {
				t.Errorf("%v", err)
				cancel()
				return false
			}
			t.Logf("PostgreSQL unreachable for %v at %d of %d orders answered (%d connections cut); %d answered when restored",
				outage, plan.last(), n, cut, l.answered.Load())
			return true
		})
	})
	loadStart := time.Now()
	l.run(ctx)
	stopKills()
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
	}, quiescence(n))
}

// kafkaOutageScenario runs two idemd replicas on one PostgreSQL and a kfake
// cluster of the test, half the clients on each, and at each kill point
// makes the broker unreachable for 10 s: every connection to it closed,
// new ones refused (kafkaGate); then restores it. Two replicas, not one:
// the broker's return then has two relays resume on one outbox, and both
// replicas rejoin consumer groups whose sessions expired during the
// outage, as a deployment with an external cluster does.
//
// Besides the invariants, it checks that the HTTP side answered orders
// while the broker was away (the outbox decouples them), that their
// events were held back (some orders still CREATED at the return: the
// outage bit), reports the time from the return until the orders answered
// before it are CONFIRMED or REJECTED (the backlog settled), and, once the
// invariants hold, that the outbox is drained (no event pending, none
// parked), that every outbox event is in the topic (copies counted), that
// nothing was dead-lettered, and that each consumer applied every event
// once and dropped the copies (checkInboxes).
//
// With e2eLongOutage (the soak: 60 s, the relay's hold timeout + 10 s),
// the first outage is that long: publishes begun during it, or in flight
// at the cut, outlive the relay's publish timeout, and the claims of those
// kgo keeps waiting for are ended by PostgreSQL, their events published
// again (copies); it logs, at the return, how many events had failed to
// publish and how many claims were open, and the same checks apply.
func kafkaOutageScenario(t *testing.T, n int) {
	db := newPGDatabase(t) // before the cluster: dropped after its processes are gone
	c := newCluster(t)
	gate := newKafkaGate()
	kc := kafkatest.New(t, kfake.ListenFn(gate.listen))
	kc.Fake(t) // the gate needs kfake: skip on IDEM_TEST_KAFKA_SEEDS
	topic := kafkatest.Name("idemd-e2e")
	kc.CreateTopic(t, topic, 3)
	kc.CreateTopic(t, topic+".dlq", 1)
	addrs := []string{freeAddr(t), freeAddr(t)}
	names := []string{"replica-a", "replica-b"}
	var replicas [2]*proc
	for i := range replicas { // one after the other: the first migrates
		args := append(commonArgs(addrs[i], db.url.String()), "-kafka", strings.Join(kc.Seeds, ","), "-kafka-topic", topic)
		replicas[i] = c.mustStart(t, names[i], args...)
	}

	kills := e2eKills()
	// The first outage is long in the soak (e2eLongOutage): past the
	// relay's publish and hold timeouts.
	long := e2eLongOutage()
	outageOf := func(i int) time.Duration {
		if i == 0 && long > 0 {
			return long
		}
		return outage
	}
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout(n, kills)+time.Duration(kills)*outage+max(0, long-outage))
	defer cancel()
	orders := makeOrders(n, e2eCustomers)
	plan := newKillPlan(n, kills, e2eClients)
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
	kctx, stopKills := context.WithCancel(ctx) // no outage after the load
	defer stopKills()
	var ctl sync.WaitGroup
	ctl.Go(func() {
		plan.each(kctx, l, func(i int) bool {
			outage := outageOf(i)
			cutAt := time.Now()
			cut := gate.cut()
			if cut == 0 {
				t.Errorf("harness: the broker had no connection to cut")
			}
			sleepCtx(ctx, outage)
			// Before the return: the orders answered so far whose saga
			// has not ended wait for the broker.
			during := l.answered.Load() - plan.last()
			waiting := answeredBy(orders, time.Now())
			held, err := db.created(ctx, waiting)
			if err != nil {
				t.Errorf("read the orders before the broker's return: %v", err)
			}
			if outage > relayPublishTimeout {
				// Publishes outlived the relay's publish timeout: those
				// that gave up left their events failed, for a retry;
				// those kgo kept waiting for (records in flight at the
				// cut) hold their claims until the hold timeout.
				failed, most, lastErr, err := db.failedAttempts(ctx)
				if err != nil {
					t.Errorf("read the outbox before the broker's return: %v", err)
				}
				claims, oldest, err := db.heldClaims(ctx)
				if err != nil {
					t.Errorf("read pg_stat_activity before the broker's return: %v", err)
				}
				t.Logf("Kafka unreachable for %v (relay's publish timeout %v, hold timeout %v): at the return %d events had failed to publish (up to %d attempts; last error %q), %d claim transactions open (oldest %.1f s)",
					outage, relayPublishTimeout, relayHoldTimeout, failed, most, clip(lastErr, 200), claims, oldest.Seconds())
			}
			if err := gate.restore(); err != nil {
				t.Errorf("%v", err)
				cancel()
				return false
			}
			restored := time.Now()
			t.Logf("Kafka unreachable for %v at %d of %d orders answered (%d connections cut); %d orders answered during it, %d of them or earlier still CREATED at the return",
				outage, plan.last(), n, cut, during, held)
			if during <= 0 {
				t.Errorf("no order answered during the %v Kafka outage: POST /v1/orders should only need PostgreSQL", outage)
			}
			if held == 0 {
				t.Errorf("harness: no order was waiting for the broker at its return: the outage did not hold anything back")
			}
			d, left := settle(db, waiting, restored, 45*time.Second)
			if left > 0 {
				p := &pipeline{db: db, seeds: kc.Seeds, topic: topic, procs: func() []*proc { return replicas[:] }}
				t.Errorf("after the broker's return: > %.0f s and %d of the %d orders answered before it are still CREATED\n%s",
					d.Seconds(), left, len(waiting), p.describe(context.Background()))
			} else {
				relay := "?"
				if first, err := db.firstPublishedSince(ctx, restored); err == nil {
					relay = fmt.Sprintf("%.1f s", first.Sub(restored).Seconds())
				}
				t.Logf("backlog settled %.1f s after the broker's return (%d orders answered before it, %d of them waiting; the relay published again after %s)",
					d.Seconds(), len(waiting), held, relay)
			}
			if outage > relayPublishTimeout {
				t.Logf("the relay's warnings and errors from the cut until settled: %s", relayLog(replicas[:], cutAt))
			}
			return true
		})
	})
	loadStart := time.Now()
	l.run(ctx)
	stopKills()
	ctl.Wait()
	t.Logf("load: %d of %d orders answered in %.1f s", l.answered.Load(), n, time.Since(loadStart).Seconds())
	plan.check(t, n, l.answered.Load())

	live := func() string {
		for _, p := range replicas {
			if p.running() {
				return p.base
			}
		}
		return replicas[0].base
	}
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
	dead := int64(0)
	for _, end := range kc.EndOffsets(t, topic+".dlq") {
		dead += end
	}
	if dead != 0 {
		t.Errorf("%d events dead-lettered to %s.dlq", dead, topic)
	}
}

// checkPublished compares the events of the outbox with the records of
// topic: each event must be there (at least once: a copy is allowed, the
// consumers' inboxes drop it, and is reported), and no record may be an
// event the outbox does not hold. It returns the numbers of outbox events
// and of records (0, 0 when it cannot read them).
func checkPublished(t *testing.T, db *pgDatabase, kc *kafkatest.Cluster, topic string) (events, records int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT CAST(event_id AS text) FROM outbox`)
	if err != nil {
		t.Errorf("read the outbox: %v", err)
		return 0, 0
	}
	copies := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Errorf("read the outbox: %v", err)
			rows.Close()
			return 0, 0
		}
		copies[id] = 0
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Errorf("read the outbox: %v", err)
		return 0, 0
	}
	recs := kc.Records(t, topic)
	var strangers, extra int
	for _, r := range recs {
		var id string
		for _, h := range r.Headers {
			if h.Key == event.HeaderEventID {
				id = string(h.Value)
			}
		}
		n, ok := copies[id]
		if !ok {
			strangers++
			continue
		}
		if n > 0 {
			extra++
		}
		copies[id] = n + 1
	}
	var missing []string
	for id, n := range copies {
		if n == 0 {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("%d of the %d outbox events are not in %s (lost), e.g. %v", len(missing), len(copies), topic, missing[:min(5, len(missing))])
	}
	if strangers > 0 {
		t.Errorf("%d records of %s are no event of the outbox", strangers, topic)
	}
	t.Logf("published: %d outbox events, %d records in %s (%d extra copies)", len(copies), len(recs), topic, extra)
	return len(copies), len(recs)
}

// checkInboxes makes sure that the consumers applied each event once and
// dropped its copies: once each consumer (inbox) has handled as many
// records as topic holds, summed over the replicas (idemd_inbox_events_total,
// applied and duplicate; none dead-lettered), its applied events must be
// its rows of processed_event, no more than the outbox's events, so that
// every copy (records - events) was one of its duplicates.
func checkInboxes(t *testing.T, db *pgDatabase, replicas []*proc, events, records int) {
	t.Helper()
	if records == 0 {
		return
	}
	var (
		counts map[string]map[string]int
		err    error
	)
	consumers := []string{app.ProjectionInbox, app.SagaInbox}
	caughtUp := func() bool {
		for _, c := range consumers {
			if counts[c]["applied"]+counts[c]["duplicate"]+counts[c]["dead_lettered"] < records {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		counts, err = inboxCounts(replicas)
		if err == nil && caughtUp() || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Errorf("read the replicas' inbox metrics: %v", err)
		return
	}
	if !caughtUp() {
		t.Errorf("consumers did not handle the %d records of the topic within 30 s: %v", records, counts)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := db.processed(ctx)
	if err != nil {
		t.Errorf("read processed_event: %v", err)
		return
	}
	for _, c := range consumers {
		n := counts[c]
		if n["applied"] != rows[c] || n["applied"] > events {
			t.Errorf("consumer %s: %d events applied, %d rows in processed_event, %d outbox events: an effect applied twice or lost",
				c, n["applied"], rows[c], events)
		}
		if n["dead_lettered"] != 0 {
			t.Errorf("consumer %s: %d records dead-lettered", c, n["dead_lettered"])
		}
		t.Logf("consumer %s: %d events applied, %d duplicates dropped (%d records, %d outbox events)",
			c, n["applied"], n["duplicate"], records, events)
	}
}

var inboxMetricRe = regexp.MustCompile(`(?m)^idemd_inbox_events_total\{consumer="([^"]+)",result="([^"]+)"\} (\S+)$`)

// inboxCounts sums idemd_inbox_events_total over the running replicas, by
// consumer and result.
func inboxCounts(replicas []*proc) (map[string]map[string]int, error) {
	hc := &http.Client{Timeout: 10 * time.Second}
	out := map[string]map[string]int{}
	for _, p := range replicas {
		if !p.running() {
			return nil, fmt.Errorf("%s is not running: its counts are lost", p.name)
		}
		resp, err := hc.Get(p.base + "/metrics")
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s/metrics: %s", p.base, resp.Status)
		}
		for _, m := range inboxMetricRe.FindAllStringSubmatch(string(b), -1) {
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				return nil, fmt.Errorf("%s/metrics: %q: %w", p.base, m[0], err)
			}
			if out[m[1]] == nil {
				out[m[1]] = map[string]int{}
			}
			out[m[1]][m[2]] += int(v)
		}
	}
	return out, nil
}

// mustStart is start for the test's goroutine.
func (c *cluster) mustStart(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p, err := c.start(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestE2EHarness checks that the invariants catch what they are about, on
// made-up answers and rows: a harness that cannot fail proves nothing.
func TestE2EHarness(t *testing.T) {
	t.Parallel()
	orders := makeOrders(4, 2)       // amounts 10000.0000, 10000.0001, 19.9, ...
	orders[0].ids = []int64{1, 2}    // one key, two orders
	orders[1].ids = []int64{3}       // over the limit
	orders[2].ids = []int64{4}       // under it
	st := dbState{orders: []dbOrder{ // orders[3] was never answered
		{id: 1, customer: 1, amount: orders[0].amount, status: "CONFIRMED"}, // no payment
		{id: 2, customer: 1, amount: orders[0].amount, status: "CREATED"},
		{id: 3, customer: 2, amount: orders[1].amount, status: "CONFIRMED"}, // want REJECTED, no payment
		{id: 4, customer: 1, amount: orders[2].amount, status: "REJECTED"},  // want CONFIRMED
		{id: 5, customer: 2, amount: orders[2].amount, status: "REJECTED"},  // nobody's
	}, payments: []dbPayment{
		{id: 9, provider: "idemd-saga", external: "order-4", amount: orders[2].amount, customer: 1},
	}}
	r := check(context.Background(), expectation{
		orders: orders,
		state:  func(context.Context) (dbState, error) { return st, nil },
		base:   func() string { return "" },
	})
	got := []int{r.answered, r.twoIDs, r.dbOrders, r.strangers, r.created, r.wrongStatus, r.badPayment, r.payNotConf}
	if want := []int{3, 1, 5, 1, 1, 3, 2, 1}; !slices.Equal(got, want) || r.ok() {
		t.Errorf("counts %v, want %v, and not ok:\n%s", got, want, r.table())
	}

	rows := st.orders[:2] // customer 1: one CONFIRMED 10000.0000, one CREATED
	for body, want := range map[string]string{
		`{"customer_id":1,"orders":2,"pending":1,"confirmed":1,"rejected":0,"total_amount":"10000.0000","last_order_id":"2"}`: "",
		`{"customer_id":1,"orders":2,"total_amount":"20000.0000","last_order_id":"2"}`:                                        `pending missing (want 1); confirmed missing (want 1); rejected missing (want 0); total_amount "20000.0000", want "10000.0000"`,
	} {
		if got := summaryDiff(1, rows, http.StatusOK, []byte(body)); got != want {
			t.Errorf("summaryDiff(%s) = %q, want %q", body, got, want)
		}
	}
	if got := summaryDiff(1, rows, http.StatusNotFound, []byte(`{}`)); got == "" {
		t.Error("summaryDiff accepts a 404 for a customer with orders")
	}
}

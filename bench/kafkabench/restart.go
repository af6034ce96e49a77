package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	osexec "os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
)

// The restart scenario runs the relay, then the consumer, in a child
// process (this binary, run with the hidden -child flags), once without
// interruption and once SIGKILLed when about half of the events are
// through and replaced at once by a new child.
const (
	childRelay    = "relay"
	childConsumer = "consumer"

	// restartTable is the consumer's business table: one ledger row per
	// event, no UNIQUE on event_id (see createSchema).
	restartTable = "effect_restart"
	// restartPoll is the FetchMaxWait of the bench's reader of the relay's
	// topic, and how often it reads the group's committed offsets while
	// the consumer runs.
	restartPoll = 10 * time.Millisecond
	// childStartTimeout bounds the wait for a child to report "ready".
	childStartTimeout = 30 * time.Second
	// restartStall is how long a run may make no progress (no new event
	// in the topic; for the consumer, no offset committed, beyond its
	// session timeout) before the bench stops waiting and checks.
	restartStall = 10 * time.Second
	// childStopTimeout bounds a graceful stop (SIGTERM) before SIGKILL.
	childStopTimeout = 15 * time.Second
	// restartInstance is the InstanceID (static group membership) that
	// the killed consumer child and its replacement share in the static
	// run.
	restartInstance = "kafkabench-consumer-0"
)

// childOpts are the hidden flags of a child process.
type childOpts struct {
	role   string // childRelay or childConsumer; "" in the bench itself
	schema string
	seeds  string // comma-separated
	topic  string
	name   string // the consumer's inbox name and group
	// instance is the consumer's InstanceID (static membership); ""
	// for a dynamic member.
	instance string
}

// runChild is a child process of the restart scenario: a relay or a
// consumer on the bench's schema and kfake broker, until SIGTERM (a
// graceful stop) or SIGKILL (the crash). It reports on stdout, a line
// each: "ready T" once connected, just before it starts; "first T" when
// its first batch is through (relay: the broker acknowledged its first
// Publish; consumer: its first batch committed, offsets included); and,
// consumer only, "batch R A D T" per partition batch (records, applied,
// duplicates). T is Unix nanoseconds.
func runChild(ctx context.Context, o options) error {
	b := &bench{o: o, schema: o.child.schema}
	seeds := strings.Split(o.child.seeds, ",")
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	report := func(format string, args ...any) {
		// One write per line (os.Stdout is unbuffered): lines written
		// before a SIGKILL stay readable in the pipe.
		_, _ = fmt.Fprintf(os.Stdout, format+" %d\n", append(args, time.Now().UnixNano())...)
	}
	var first sync.Once
	switch o.child.role {
	case childRelay:
		pub, err := newPublisher(ctx, seeds, o.child.topic, logger)
		if err != nil {
			return err
		}
		defer pub.Close()
		conc := o.relayConc
		if conc == 0 {
			conc = 2 // outbox.RelayConfig's default
		}
		pool, pgd, err := b.open(ctx, conc+1)
		if err != nil {
			return err
		}
		defer pool.Close()
		var drv driver.Driver[pgx.Tx] = pgd
		acked := outbox.PublisherFunc(func(ctx context.Context, evs []event.Envelope) error {
			err := pub.Publish(ctx, evs)
			if err == nil {
				first.Do(func() { report("first") })
			}
			return err
		})
		relay, err := outbox.NewRelay(drv, acked, &outbox.RelayConfig{Concurrency: o.relayConc, Logger: logger})
		if err != nil {
			return err
		}
		report("ready")
		if err := relay.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	case childConsumer:
		pool, drv, err := b.open(ctx, 2)
		if err != nil {
			return err
		}
		defer pool.Close()
		in, err := inbox.New(drv, &inbox.Config{Consumer: o.child.name, Logger: logger})
		if err != nil {
			return err
		}
		eff := effectSQL(restartTable)
		c, err := idemkafka.NewConsumer(in, &idemkafka.ConsumerConfig[pgx.Tx]{
			Seeds:  seeds,
			Topics: []string{o.child.topic},
			// The effect: one ledger row per event, in the transaction
			// that records the event's ID in the inbox.
			Handler: func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
				var p relayPayload
				if err := json.Unmarshal(e.Payload, &p); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, eff, pgtype.UUID{Bytes: e.ID, Valid: true}, e.Key, int64(p.Seq))
				return err
			},
			OnBatch: func(_ context.Context, s idemkafka.BatchStats) {
				first.Do(func() { report("first") })
				report("batch %d %d %d", s.Records, s.Applied, s.Duplicates)
			},
			Logger: logger,
			// A static member (the static run) takes its partitions back
			// at once when it rejoins under the same ID.
			InstanceID: o.child.instance,
			// A SIGKILLed member never leaves the group: its partitions
			// move to the new member once its session has expired.
			ExtraOpts: []kgo.Opt{kgo.SessionTimeout(o.restartSession), kgo.HeartbeatInterval(o.restartSession / 3)},
		})
		if err != nil {
			return err
		}
		report("ready")
		return c.Run(ctx)
	default:
		return fmt.Errorf("unknown -child %q", o.child.role)
	}
}

// child is a child process seen from the bench.
type child struct {
	cmd    *osexec.Cmd
	ready  chan time.Time // its "ready" line
	first  chan time.Time // its "first" line
	exited chan struct{}  // closed once it exited; then err is set
	err    error

	mu                              sync.Mutex
	batches, records, applied, dups int // its "batch" lines: their count and sums
}

// startChild starts a child process of role on topic; a consumer with
// instance as its InstanceID unless it is empty.
func (b *bench) startChild(ctx context.Context, role, seeds, topic, name, instance string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	args := []string{"-child", role, "-child-schema", b.schema, "-child-seeds", seeds, "-child-topic", topic, "-child-name", name,
		"-dsn", b.o.dsn, "-relay-concurrency", strconv.Itoa(b.o.relayConc), "-restart-session", b.o.restartSession.String()}
	if b.o.syncCommit != "" {
		args = append(args, "-synchronous-commit", b.o.syncCommit)
	}
	if instance != "" {
		args = append(args, "-child-instance", instance)
	}
	cmd := osexec.CommandContext(ctx, exe, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("restart: start child %s: %w", role, err)
	}
	c := &child{cmd: cmd, ready: make(chan time.Time, 1), first: make(chan time.Time, 1), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			ns, err := strconv.ParseInt(f[len(f)-1], 10, 64)
			if err != nil {
				continue
			}
			at := time.Unix(0, ns)
			switch f[0] {
			case "ready":
				c.ready <- at
			case "first":
				c.first <- at
			case "batch":
				if len(f) == 5 {
					r, _ := strconv.Atoi(f[1])
					a, _ := strconv.Atoi(f[2])
					d, _ := strconv.Atoi(f[3])
					c.mu.Lock()
					c.batches, c.records, c.applied, c.dups = c.batches+1, c.records+r, c.applied+a, c.dups+d
					c.mu.Unlock()
				}
			}
		}
		c.err = cmd.Wait() // after the last read, as StdoutPipe requires
		close(c.exited)
	}()
	return c, nil
}

// waitReady returns the time the child reported "ready".
func (c *child) waitReady() (time.Time, error) {
	select {
	case at := <-c.ready:
		return at, nil
	case <-c.exited:
		return time.Time{}, fmt.Errorf("restart: child exited before it was ready: %w", c.exitErr())
	case <-time.After(childStartTimeout):
		c.kill()
		return time.Time{}, errors.New("restart: child not ready in time")
	}
}

// exitErr says how the child exited, once it has.
func (c *child) exitErr() error {
	if c.err == nil {
		return errors.New("exited with status 0")
	}
	return c.err
}

// kill sends SIGKILL: the crash.
func (c *child) kill() { _ = c.cmd.Process.Kill() }

// stop stops the child gracefully (SIGTERM) and waits for it.
func (c *child) stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(childStopTimeout):
		c.kill()
		<-c.exited
		return errors.New("restart: child did not stop on SIGTERM")
	}
	if c.err != nil {
		return fmt.Errorf("restart: child: %w", c.err)
	}
	return nil
}

// restartRun is one run of the relay or the consumer, with or without the
// crash.
type restartRun struct {
	events  int           // through at the end: in the topic, or committed
	elapsed time.Duration // from the first child's "ready" to the last event through
	eps     float64
	stalled bool // it stopped making progress before the end
	killed  bool
	killAt  time.Time     // when the first child was SIGKILLed
	atKill  int           // events through at that moment
	toReady time.Duration // kill -> the new child's "ready"
	gap     time.Duration // kill -> the new child's "first"
	// The consumer's: the partition batches of the new child (or the
	// only one), their records, what it skipped as duplicates and applied.
	batches, records, dups, applied int
}

// restartResult is everything the scenario measured.
type restartResult struct {
	relay, relayKill       restartRun
	relayChk, relayKillChk logCheck
	unpublished            [2]int
	cons, consKill         restartRun
	consStatic             restartRun // killed and restarted, a static member
	effects, distinct      [3]int     // uninterrupted, killed, static
	processed              [3]int
}

// runRestart runs the restart scenario and prints its figures and checks.
func (b *bench) runRestart(ctx context.Context) error {
	o := b.o
	n := o.restartN
	topic := fmt.Sprintf("kafkabench-%s-restart", b.runID)
	topicKill := topic + "-kill"
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.partitions), topic, topicKill),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("start kfake: %w", err)
	}
	defer kf.Close()
	seeds := kf.ListenAddrs()
	fmt.Printf("restart: a relay, then a consumer, in a child process (this program re-executed), SIGKILLed when about half of the events are through\n")
	fmt.Printf("         and replaced at once by a new one; each compared with an uninterrupted run. kfake (1 broker, in process, TCP), %d partitions\n", o.partitions)

	var r restartResult
	if r.relay, r.relayChk, r.unpublished[0], err = b.relayRestart(ctx, seeds, topic, false); err != nil {
		return err
	}
	if r.relayKill, r.relayKillChk, r.unpublished[1], err = b.relayRestart(ctx, seeds, topicKill, true); err != nil {
		return err
	}
	relayOK := func(chk logCheck, unpublished int) bool {
		return chk.distinct == n && chk.unknown == 0 && chk.disorder == 0 && unpublished == 0
	}
	okRelay := relayOK(r.relayChk, r.unpublished[0]) && relayOK(r.relayKillChk, r.unpublished[1])
	fmt.Printf("relay: outbox backlog of %d events over %d keys (filled untimed, as in relay), RelayConfig defaults (BatchSize 500, Concurrency %s), one relay process at a time;\n",
		n, o.relayKeys, concString(o.relayConc))
	fmt.Printf("       timed from the first relay's start to the last event in the topic (a kgo reader follows it; the kill comes when it saw half)\n")
	fmt.Printf("       uninterrupted: %s\n", r.relay.describe(n))
	fmt.Printf("       killed:        %s; %.2fx the uninterrupted\n", r.relayKill.describe(n), r.relayKill.eps/r.relay.eps)
	fmt.Printf("       gap: kill -> new relay ready %s (process start, pool, broker ping), kill -> its first publish acknowledged %s\n",
		r.relayKill.toReady.Round(time.Millisecond), gapString(r.relayKill.gap))
	fmt.Printf("       published twice: %d events (at-least-once across a crash: batches acknowledged but not yet marked when it died)\n", r.relayKillChk.dups)
	for i, c := range []logCheck{r.relayChk, r.relayKillChk} {
		fmt.Printf("       read back (%s): %d records, %d distinct events, %d duplicates, %d missing, %d unknown; per-key order violations: %d; outbox rows left unpublished: %d\n",
			[]string{"uninterrupted", "killed"}[i], c.records, c.distinct, c.dups, n-c.distinct, c.unknown, c.disorder, r.unpublished[i])
	}
	fmt.Printf("check relay restart: every event in the topic, none missing, per-key order of first copies kept: %s\n", okStr(okRelay))

	// Both consumer runs read the uninterrupted relay's topic: it holds
	// each event once (the duplicates it may hold are printed above and
	// expected among the skipped records), so what the new consumer skips
	// is redeliveries.
	fmt.Println()
	if r.cons, r.effects[0], r.distinct[0], r.processed[0], err = b.consumerRestart(ctx, seeds, topic, "kafkabench-restart", "", false, 0); err != nil {
		return err
	}
	// The kill falls at random within one batch's time (the uninterrupted
	// run's mean) after half of the records are committed.
	jitter := r.cons.elapsed / time.Duration(max(r.cons.batches, 1))
	if r.consKill, r.effects[1], r.distinct[1], r.processed[1], err = b.consumerRestart(ctx, seeds, topic, "kafkabench-restart-kill", "", true, jitter); err != nil {
		return err
	}
	// The same crash, the killed child and its replacement static members
	// under one InstanceID, in a group and inbox of their own.
	if r.consStatic, r.effects[2], r.distinct[2], r.processed[2], err = b.consumerRestart(ctx, seeds, topic, "kafkabench-restart-static", restartInstance, true, jitter); err != nil {
		return err
	}
	okCons := true
	fmt.Printf("consumer: idemkafka.Consumer on the uninterrupted relay's topic, Handler: one ledger row per event in the inbox's transaction;\n")
	fmt.Printf("          session timeout %s (-restart-session; the new member gets the partitions once the killed one's session expired);\n", o.restartSession)
	fmt.Printf("          SIGKILL once half of the records are committed, plus a random 0-%s (one batch's time: the kill falls anywhere in a batch)\n", jitter.Round(time.Millisecond))
	fmt.Printf("          uninterrupted: %s; %d partition batches (one transaction each) of %.0f records on average\n",
		r.cons.describe(n), r.cons.batches, float64(r.cons.records)/max(float64(r.cons.batches), 1))
	fmt.Printf("          killed:        %s; %.2fx the uninterrupted\n", r.consKill.describe(n), r.consKill.eps/r.cons.eps)
	fmt.Printf("          gap: kill -> new consumer ready %s, kill -> its first batch committed %s\n",
		r.consKill.toReady.Round(time.Millisecond), gapString(r.consKill.gap))
	fmt.Printf("          redelivered after the restart: %d records already applied, skipped by the inbox as duplicates; the new consumer polled %d records, applied %d\n",
		r.consKill.dups, r.consKill.records, r.consKill.applied)
	fmt.Printf("          (a batch's offsets are committed right after its transaction: only a kill between the two leaves applied records to redeliver;\n")
	fmt.Printf("          the transaction a kill interrupts rolls back, and its records are applied again, not skipped)\n")
	fmt.Printf("          static member: the same kill and restart, both children joining with InstanceID %q (a group and inbox of its own, same session timeout);\n", restartInstance)
	fmt.Printf("          the new member takes the killed one's partitions back at once instead of waiting for its session to expire\n")
	fmt.Printf("          static:        %s; %.2fx the uninterrupted\n", r.consStatic.describe(n), r.consStatic.eps/r.cons.eps)
	fmt.Printf("          gap (static): kill -> new consumer ready %s, kill -> its first batch committed %s\n",
		r.consStatic.toReady.Round(time.Millisecond), gapString(r.consStatic.gap))
	fmt.Printf("          redelivered after the static restart: %d records already applied, skipped by the inbox as duplicates; the new consumer polled %d records, applied %d\n",
		r.consStatic.dups, r.consStatic.records, r.consStatic.applied)
	// consOK prints run i's effects line and says whether its check holds.
	consOK := func(i int, run restartRun) bool {
		missing, doubled := n-r.distinct[i], r.effects[i]-r.distinct[i]
		fmt.Printf("          effects (%s): %d rows for %d events: %d missing, %d doubled; processed_event rows %d; skipped %d\n",
			[]string{"uninterrupted", "killed", "static"}[i], r.effects[i], n, missing, doubled, r.processed[i], run.dups)
		return missing == 0 && doubled == 0 && r.effects[i] == n && r.processed[i] == n && (run.killed || run.dups == r.relayChk.dups)
	}
	for i, run := range []restartRun{r.cons, r.consKill} {
		okCons = consOK(i, run) && okCons
	}
	okStatic := consOK(2, r.consStatic)
	fmt.Printf("check consumer restart: exactly one effect per event: %s\n", okStr(okCons))
	fmt.Printf("check consumer restart, static member: exactly one effect per event: %s\n", okStr(okStatic))
	if !okRelay || !okCons || !okStatic {
		return errors.New("restart: a check failed (see above)")
	}
	return nil
}

// concString is the relay's Concurrency as -relay-concurrency sets it.
func concString(c int) string {
	if c == 0 {
		return "2" // outbox.RelayConfig's default
	}
	return strconv.Itoa(c)
}

// describe prints a run's throughput and, for a killed run, when.
func (r restartRun) describe(n int) string {
	s := fmt.Sprintf("%d events in %s = %.0f events/s", r.events, r.elapsed.Round(time.Millisecond), r.eps)
	if r.stalled {
		s = fmt.Sprintf("STALLED (no progress for %s): %d of %d events in %s = %.0f events/s", restartStall, r.events, n, r.elapsed.Round(time.Millisecond), r.eps)
	}
	if r.killed {
		s += fmt.Sprintf(" (SIGKILL at %d, %.0f%%)", r.atKill, 100*float64(r.atKill)/float64(n))
	}
	return s
}

// gapString prints a kill -> first batch gap; negative: none came.
func gapString(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return d.Round(time.Millisecond).String()
}

// relayRestart fills the outbox with -restart-n events and times a relay
// child draining it into topic, from its "ready" until a reader of the
// topic has seen every event. With crash, the child is SIGKILLed once
// the reader has seen half of them, and a new one started at once.
func (b *bench) relayRestart(ctx context.Context, seeds []string, topic string, crash bool) (restartRun, logCheck, int, error) {
	o := b.o
	n := o.restartN
	var run restartRun
	var chk logCheck
	if _, err := b.admin.Exec(ctx, "TRUNCATE "+b.outboxTables()); err != nil {
		return run, chk, 0, fmt.Errorf("truncate outbox: %w", err)
	}
	if err := b.fillOutbox(ctx, n); err != nil {
		return run, chk, 0, err
	}
	for _, q := range []string{"VACUUM ANALYZE " + b.outboxTables(), "CHECKPOINT"} {
		if _, err := b.admin.Exec(ctx, q); err != nil {
			return run, chk, 0, fmt.Errorf("restart: %w", err)
		}
	}
	w, err := watchTopic(ctx, seeds, topic, n)
	if err != nil {
		return run, chk, 0, err
	}
	defer w.close()

	seedList := strings.Join(seeds, ",")
	c, err := b.startChild(ctx, childRelay, seedList, topic, "", "")
	if err != nil {
		return run, chk, 0, err
	}
	defer c.kill() // a no-op once it exited
	start, err := c.waitReady()
	if err != nil {
		return run, chk, 0, err
	}
	deadline := time.After(o.relayTimeout)
	if crash {
		select {
		case <-w.half:
		case <-c.exited:
			return run, chk, 0, fmt.Errorf("restart: relay child: %w", c.exitErr())
		case <-deadline:
			return run, chk, 0, errors.New("restart: relay: half of the events never reached the topic")
		}
		if c, run.atKill, err = replaceChild(c, &run, func() (*child, error) {
			return b.startChild(ctx, childRelay, seedList, topic, "", "")
		}, func() int { return int(w.distinct.Load()) }); err != nil {
			return run, chk, 0, err
		}
		defer c.kill()
	}
	// Wait for every event, or until the topic stops filling (an event
	// that is never published: the checks below then fail).
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, lastAt := w.distinct.Load(), time.Now()
wait:
	for {
		select {
		case <-w.done:
			run.elapsed = w.doneAt.Sub(start)
			break wait
		case <-tick.C:
			if d := w.distinct.Load(); d != last {
				last, lastAt = d, time.Now()
			} else if time.Since(lastAt) >= restartStall {
				run.stalled, run.elapsed = true, lastAt.Sub(start)
				break wait
			}
		case <-c.exited:
			return run, chk, 0, fmt.Errorf("restart: relay child: %w", c.exitErr())
		case <-deadline:
			return run, chk, 0, fmt.Errorf("restart: relay: %d of %d events in the topic after %s", w.distinct.Load(), n, o.relayTimeout)
		}
	}
	run.events = int(w.distinct.Load())
	run.eps = float64(run.events) / run.elapsed.Seconds()
	if crash {
		select {
		case first := <-c.first:
			run.gap = first.Sub(run.killAt)
		default:
			run.gap = -1 // the new relay published nothing
		}
	}
	// The last batch is marked published just after its acknowledgement.
	unpublished, err := b.waitPending(ctx)
	if err != nil {
		return run, chk, 0, err
	}
	if err := c.stop(); err != nil {
		return run, chk, 0, err
	}
	chk, err = readBack(ctx, seeds, topic)
	return run, chk, unpublished, err
}

// replaceChild SIGKILLs c, starts a new child at once with start, and waits
// until it is ready. It records in run when and at what progress (given by
// progress, read just before the kill) the kill happened.
func replaceChild(c *child, run *restartRun, start func() (*child, error), progress func() int) (*child, int, error) {
	at := progress()
	killAt := time.Now()
	c.kill()
	run.killed = true
	run.killAt = killAt
	nc, err := start()
	if err != nil {
		return nil, at, err
	}
	ready, err := nc.waitReady()
	if err != nil {
		nc.kill()
		return nil, at, err
	}
	<-c.exited
	run.toReady = ready.Sub(killAt)
	return nc, at, nil
}

// waitPending waits (up to 30s) until no outbox row is pending and returns
// how many still are.
func (b *bench) waitPending(ctx context.Context) (int, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var pending int
		if err := b.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{b.schema, "outbox_pending"}.Sanitize()).Scan(&pending); err != nil {
			return 0, fmt.Errorf("restart: %w", err)
		}
		if pending == 0 || time.Now().After(deadline) {
			return pending, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// topicWatch follows a topic as it fills and counts its distinct events.
type topicWatch struct {
	distinct atomic.Int64
	half     chan struct{} // closed at n/2 distinct events
	done     chan struct{} // closed at n; doneAt is then set
	doneAt   time.Time
	cancel   context.CancelFunc
	stopped  chan struct{}
}

// watchTopic starts reading topic from its start, until n distinct events
// were seen.
func watchTopic(ctx context.Context, seeds []string, topic string, n int) (*topicWatch, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(restartPoll))
	if err != nil {
		return nil, err
	}
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("kfake ping: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &topicWatch{half: make(chan struct{}), done: make(chan struct{}), cancel: cancel, stopped: make(chan struct{})}
	go func() {
		defer close(w.stopped)
		defer cl.Close()
		seen := make(map[uuid.UUID]struct{}, n)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			at := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				e, err := idemkafka.Envelope(r)
				if err != nil {
					return
				}
				if _, ok := seen[e.ID]; ok {
					return
				}
				seen[e.ID] = struct{}{}
				switch w.distinct.Add(1) {
				case int64(n / 2):
					close(w.half)
				case int64(n):
					w.doneAt = at
					close(w.done)
				}
			})
			if len(seen) >= n {
				return
			}
		}
	}()
	return w, nil
}

func (w *topicWatch) close() {
	w.cancel()
	<-w.stopped
}

// consumerRestart times a consumer child (inbox and group name) applying
// every record of topic, from its "ready" until the group's committed
// offsets reach the end of every partition. With crash, the child is
// SIGKILLed a random time within jitter after half of the records are
// committed (the bench sees a commit soon after it happened: without the
// jitter the kill would always fall at the start of a batch), and a new
// member of the group started at once; with instance, both children are
// static members under that InstanceID. It returns the effect rows, their
// distinct event IDs and the inbox's rows.
func (b *bench) consumerRestart(ctx context.Context, seeds []string, topic, name, instance string, crash bool, jitter time.Duration) (run restartRun, effects, distinct, processed int, err error) {
	o := b.o
	_, err = b.admin.Exec(ctx, "TRUNCATE "+pgx.Identifier{b.schema, "processed_event"}.Sanitize()+", "+pgx.Identifier{b.schema, restartTable}.Sanitize())
	if err != nil {
		return run, 0, 0, 0, fmt.Errorf("restart: %w", err)
	}
	if _, err := b.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return run, 0, 0, 0, fmt.Errorf("checkpoint: %w", err)
	}
	acl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return run, 0, 0, 0, err
	}
	defer acl.Close()
	adm := kadm.NewClient(acl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return run, 0, 0, 0, fmt.Errorf("end offsets: %w", err)
	}
	end := map[int32]int64{}
	var total int64
	ends.Each(func(lo kadm.ListedOffset) {
		end[lo.Partition] = lo.Offset
		total += lo.Offset
	})
	// committed returns the records committed by the group so far, and
	// whether every partition is committed to its end.
	committed := func() (int64, bool) {
		offs, err := adm.FetchOffsets(ctx, name)
		if err != nil {
			return 0, false
		}
		var sum int64
		all := true
		for p, e := range end {
			at := int64(0)
			if or, ok := offs.Lookup(topic, p); ok && or.Err == nil && or.At > 0 {
				at = or.At
			}
			sum += min(at, e)
			all = all && at >= e
		}
		return sum, all
	}

	seedList := strings.Join(seeds, ",")
	c, err := b.startChild(ctx, childConsumer, seedList, topic, name, instance)
	if err != nil {
		return run, 0, 0, 0, err
	}
	defer c.kill()
	start, err := c.waitReady()
	if err != nil {
		return run, 0, 0, 0, err
	}
	deadline := time.Now().Add(o.relayTimeout)
	var doneAt time.Time
	var last int64
	var killAt time.Time // when half is committed: then + a random share of jitter
	lastAt := time.Now()
	for {
		sum, all := committed()
		if all {
			doneAt, last = time.Now(), sum
			break
		}
		// Committed offsets that stop moving (a record never applied):
		// stop waiting, the checks below then fail.
		if sum != last {
			last, lastAt = sum, time.Now()
		} else if time.Since(lastAt) >= o.restartSession+restartStall {
			run.stalled, doneAt = true, lastAt
			break
		}
		if crash && killAt.IsZero() && sum >= total/2 {
			killAt = time.Now().Add(mrand.N(max(jitter, 1)))
		}
		if crash && !run.killed && !killAt.IsZero() && !time.Now().Before(killAt) {
			if c, run.atKill, err = replaceChild(c, &run, func() (*child, error) {
				return b.startChild(ctx, childConsumer, seedList, topic, name, instance)
			}, func() int { return int(sum) }); err != nil {
				return run, 0, 0, 0, err
			}
			defer c.kill()
			continue
		}
		wait := restartPoll
		if !run.killed && !killAt.IsZero() {
			wait = min(wait, max(time.Until(killAt), 0))
		}
		select {
		case <-c.exited:
			return run, 0, 0, 0, fmt.Errorf("restart: consumer child: %w", c.exitErr())
		case <-ctx.Done():
			return run, 0, 0, 0, ctx.Err()
		case <-time.After(wait):
		}
		if time.Now().After(deadline) {
			return run, 0, 0, 0, fmt.Errorf("restart: consumer: %d of %d records committed after %s", sum, total, o.relayTimeout)
		}
	}
	run.elapsed = doneAt.Sub(start)
	run.events = int(last)
	run.eps = float64(run.events) / run.elapsed.Seconds()
	if err := c.stop(); err != nil {
		return run, 0, 0, 0, err
	}
	if run.killed {
		select {
		case first := <-c.first:
			run.gap = first.Sub(run.killAt)
		default:
			run.gap = -1 // the new consumer committed nothing
		}
	}
	c.mu.Lock()
	run.batches, run.records, run.dups, run.applied = c.batches, c.records, c.dups, c.applied
	c.mu.Unlock()
	err = b.admin.QueryRow(ctx, "SELECT count(*), count(DISTINCT event_id) FROM "+pgx.Identifier{b.schema, restartTable}.Sanitize()).Scan(&effects, &distinct)
	if err == nil {
		err = b.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{b.schema, "processed_event"}.Sanitize()+
			" WHERE consumer_name = $1", name).Scan(&processed)
	}
	return run, effects, distinct, processed, err
}

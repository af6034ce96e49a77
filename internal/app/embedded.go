package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/dbclock"
	"github.com/idemkit/idem/outbox"
)

// The embedded broker's guard rails.
const (
	// EmbeddedLock is the lease (table idem_lock) held by the idemd that
	// runs the embedded broker of a database: a second one refuses to
	// start, since its broker would be a second, disjoint Kafka.
	EmbeddedLock = "idemd.embedded-kafka"
	// embeddedLockTTL is the lease's length; it is renewed every third.
	embeddedLockTTL = 15 * time.Second
	// embeddedPublishGuard: the relay publishes into the embedded broker
	// only while this process's lease has at least this long to run (by
	// its last renewal), and marks published only what it published while
	// that was still so (see fencedPublisher). A renewal every third of
	// the lease keeps 10 to 15 s: two renewals in a row must fail for the
	// relay to wait, and a process frozen past its lease (a long GC or
	// memory stall, a VM migration, SIGSTOP), whose lease another idemd
	// may hold by now, publishes nothing when it wakes up before its next
	// renewal tells.
	embeddedPublishGuard = embeddedLockTTL / 3
	// EmbeddedRetention is how long the embedded broker keeps a record of
	// the events' topic: under the inboxes' retention
	// (cleanup.DefaultInboxTTL, 72h), so that no event can be delivered
	// again after the sweep forgot it was applied (the redelivery horizon
	// of the retention rules). The broker applies retention hourly, so a
	// record may outlive it by an hour: 70h. A consumer that stays behind
	// longer loses the events it did not read, as with any Kafka; Redrive
	// publishes again what the outbox still holds.
	EmbeddedRetention = cleanup.DefaultInboxTTL - 2*time.Hour
	// embeddedMarker is the file in the broker's log directory naming the
	// database whose events it holds: its place, then " instance=" and its
	// instance ID (a marker without one was written before instance IDs
	// existed and is checked by place alone, once, then rewritten).
	embeddedMarker = "idemd-database"
	markerInstance = " instance="
)

// embeddedBroker is a running embedded broker and the lease that makes it
// the only one of its database.
type embeddedBroker struct {
	cluster *kfake.Cluster
	dir     string
	// fresh is true when the log directory held no log of this database:
	// whatever the outbox says was published is not in it. adopted is set
	// once adopt redrove the outbox into it: until then nothing may be
	// published into it (a key's later events would overtake the ones
	// not redriven yet).
	fresh    bool
	adopted  atomic.Bool
	lease    *lease
	identity dbIdentity
}

// startEmbedded takes the database's embedded-broker lease, checks that the
// log directory belongs to this database (identify) and starts the broker
// on it. A new log (fresh) is not marked as this database's yet: adopt does
// that once the outbox was redriven into it, before the relay starts, so
// a redrive that a stop, a crash or an error interrupts is done again at
// the next start.
func startEmbedded[TTx any](ctx context.Context, a *App, drv driver.Driver[TTx], identify func(context.Context) (dbIdentity, error)) (*embeddedBroker, error) {
	ls, err := acquireLease(ctx, a, drv.Executor(), dbclock.New(drv, a.log, "embedded broker"), EmbeddedLock)
	if err != nil {
		return nil, err
	}
	if err := expireRelayLease(ctx, a, drv.Executor()); err != nil {
		ls.release()
		return nil, err
	}
	dir := a.cfg.EmbeddedKafkaDir()
	identity, err := identify(ctx)
	var fresh bool
	if err == nil {
		fresh, err = checkMarker(dir, identity)
	}
	if err == nil {
		err = os.MkdirAll(dir, 0o750)
	}
	if err != nil {
		ls.release()
		return nil, err
	}
	addr := a.cfg.KafkaEmbeddedAddr
	if addr == "" {
		addr = DefaultKafkaEmbeddedAddr
	}
	cluster, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		// Any -kafka-session-timeout idemd accepts.
		kfake.GroupMinSessionTimeout(MinSessionTimeout),
		kfake.GroupMaxSessionTimeout(MaxSessionTimeout),
		kfake.SeedTopics(EmbeddedPartitions, a.cfg.KafkaTopic),
		kfake.SeedTopics(1, a.cfg.KafkaTopic+idemkafka.DeadLetterSuffix),
		// The log survives a stop and a crash: a produce is acknowledged
		// after its batch is written and synced.
		kfake.DataDir(dir),
		kfake.SyncWrites(),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, addr) }),
	)
	if err != nil {
		ls.release()
		return nil, fmt.Errorf("start the embedded broker on %s with log %s: %w", addr, dir, err)
	}
	// kfake seeds topics only into an empty log directory: a log from a
	// first start that crashed before it saved its topics, or one written
	// with another -kafka-topic, lacks them.
	if err := ensureTopics(ctx, cluster, fresh, a.cfg.KafkaTopic); err != nil {
		cluster.Close()
		ls.release()
		return nil, err
	}
	// Not on the dead-letter topic: dead letters were never applied, and
	// they are an operator's evidence.
	if err := setRetention(ctx, cluster, EmbeddedRetention, a.cfg.KafkaTopic); err != nil {
		cluster.Close()
		ls.release()
		return nil, fmt.Errorf("embedded broker: %w", err)
	}
	if !fresh {
		// Rewritten: a marker from before instance IDs gets one.
		if err := writeMarker(dir, identity); err != nil {
			cluster.Close()
			ls.release()
			return nil, err
		}
	}
	b := &embeddedBroker{cluster: cluster, dir: dir, fresh: fresh, lease: ls, identity: identity}
	b.adopted.Store(!fresh)
	return b, nil
}

// adopt makes a new log this database's: every event still in the outbox
// is published again (the new log holds none of them; consumers' inboxes
// drop what they had applied), then the marker is written. It runs before
// the relay (so a key's redriven events keep their order), on the run's
// context: a large outbox is not cut short by the start-up deadline, and
// an interrupted redrive leaves no marker, so the next start does it again.
func (b *embeddedBroker) adopt(ctx context.Context, a *App, redrive func(context.Context) (int, error)) error {
	if b.adopted.Load() {
		return nil
	}
	a.log.Info("embedded broker: new log, publishing every event still in the outbox again", "log", b.dir)
	n, err := redrive(ctx)
	if err != nil {
		return fmt.Errorf("republish the outbox into the new broker log %s (done again at the next start): %w", b.dir, err)
	}
	if n > 0 {
		a.log.Warn("embedded broker: new log, every event still in the outbox is published again (consumers drop the ones they applied)",
			"log", b.dir, "events", n)
	}
	if err := writeMarker(b.dir, b.identity); err != nil {
		return err
	}
	b.adopted.Store(true)
	return nil
}

// close stops the broker (its log is synced) and releases the lease.
func (b *embeddedBroker) close() {
	b.cluster.Close()
	b.lease.release()
}

// checkMarker reads dir's marker: fresh is true when there is none (no
// log, or one that no idemd of this version named). A marker naming
// another database, or an earlier database at the same place (deleted and
// created again), is a *ConfigError: the log's events are not this
// database's, and its consumer offsets are past events this one has not
// published yet.
func checkMarker(dir string, id dbIdentity) (fresh bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, embeddedMarker))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("embedded broker log %s: %w", dir, err)
	}
	where, inst, _ := strings.Cut(strings.TrimSpace(string(b)), markerInstance)
	switch {
	case inst == id.Instance:
		// This database, wherever it is now (a SQLite file moved with
		// its log, a server reached at another address).
		return false, nil
	case inst == "" && where == id.Where:
		// A marker from before instance IDs: the place must do.
		return false, nil
	case where == id.Where:
		return false, &ConfigError{msg: fmt.Sprintf("embedded broker log %s holds the events of an earlier database at %s (instance %s), "+
			"not of this one (instance %s): the database was created again. To start over, delete the log too (rm -r %s); "+
			"to keep the old events, restore the old database",
			dir, where, inst, id.Instance, dir)}
	default:
		return false, &ConfigError{msg: fmt.Sprintf("embedded broker log %s holds the events of another database (%s), "+
			"this one is %s: give each database its own -kafka-dir",
			dir, strings.TrimSpace(string(b)), id.Where+markerInstance+id.Instance)}
	}
}

func writeMarker(dir string, id dbIdentity) error {
	p := filepath.Join(dir, embeddedMarker)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(id.Where+markerInstance+id.Instance+"\n"), 0o640); err != nil {
		return fmt.Errorf("embedded broker log %s: %w", dir, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("embedded broker log %s: %w", dir, err)
	}
	return nil
}

// errLeaseTaken: another idemd took this one's embedded-broker lease. This
// process must stop publishing at once: its broker's log no longer belongs
// to the database, and events published there would reach no consumer.
var errLeaseTaken = errors.New("lease taken")

// lease is a held lease of table idem_lock, renewed in the background until
// release.
type lease struct {
	name, owner string
	ex          driver.LockExecutor
	clock       *dbclock.Clock
	stop        context.CancelFunc
	done        chan struct{}
	// validUntil is when the lease expires by its last acquisition or
	// renewal (UnixNano), counted from a clock reading taken before the
	// statement: never later than the expiry another idemd sees.
	validUntil atomic.Int64
	// kick asks renew for a renewal now (buffered, nil: never): the
	// fenced publisher found the lease not surely held, after a database
	// outage say, and the next tick may be 5 s away.
	kick chan struct{}
}

// held reports whether the lease surely has guard left to run at now.
func (l *lease) held(now time.Time, guard time.Duration) bool {
	return now.Add(guard).UnixNano() < l.validUntil.Load()
}

// acquireLease takes the lease name for this process. A holder on this host
// is taken over at once if its process is gone, and refused at once if it
// runs; a holder on another host is waited for up to one lease length (it
// may have died without releasing it). A refusal is a *ConfigError saying
// who holds it. The lease's times come from clock, the host's corrected by
// the database's: another idemd, on a host whose clock runs ahead, must
// not take it over while this one renews it.
func acquireLease(ctx context.Context, a *App, ex driver.LockExecutor, clock *dbclock.Clock, name string) (*lease, error) {
	host, _ := os.Hostname()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	owner := fmt.Sprintf("%s/%d/%s/%s", host, os.Getpid(), hex.EncodeToString(rnd[:]), pidNamespace())
	deadline := time.Now().Add(embeddedLockTTL + time.Second)
	var now time.Time
	// The lease's times are the database's: until this host's offset to
	// it is measured, its own clock, maybe far ahead, would find a live
	// lease lapsed and take it.
	for try := 1; !clock.Measure(ctx); try++ {
		if try == 1 {
			a.log.Info("embedded broker: could not read the database's clock in time; trying again before taking the lease", "lease", name)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lease %s: the database's clock could not be read (tried %d times): %w", name, try, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	for waited := false; ; waited = true {
		clock.Sync(ctx)
		now = clock.Now()
		ok, err := ex.LockAcquire(ctx, &driver.LockAcquireParams{Name: name, Owner: owner, Now: now, Until: now.Add(embeddedLockTTL)})
		if err != nil {
			return nil, fmt.Errorf("lease %s: %w", name, err)
		}
		if ok {
			if waited {
				a.log.Info("embedded broker: lease taken over after its holder stopped renewing it", "lease", name)
			}
			break
		}
		holder, _, err := ex.LockGet(ctx, &driver.LockGetParams{Name: name})
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			return nil, fmt.Errorf("lease %s: %w", name, err)
		}
		local, dead := holderOnThisHost(holder, host)
		if local && dead {
			// Expire it; the next LockAcquire takes it (or loses to a
			// concurrent starter, who then holds it).
			if err := expireLease(ctx, ex, name, holder, clock.Now()); err != nil {
				return nil, fmt.Errorf("lease %s: %w", name, err)
			}
			a.log.Info("embedded broker: taking over the lease of a stopped idemd on this host", "lease", name, "holder", holder)
			continue
		}
		if local || time.Now().After(deadline) { // a live process here, or a lease still renewed
			return nil, &ConfigError{msg: fmt.Sprintf("another idemd (%s) runs the embedded Kafka broker of this database: run every replica with -kafka host:port (a shared Kafka cluster), or stop the other one",
				holder)}
		}
		if !waited {
			a.log.Info("embedded broker: lease held by another idemd, waiting for it to expire", "lease", name, "holder", holder, "ttl", embeddedLockTTL.String())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l := &lease{name: name, owner: owner, ex: ex, clock: clock, stop: stop, done: make(chan struct{}), kick: make(chan struct{}, 1)}
	l.validUntil.Store(now.Add(embeddedLockTTL).UnixNano())
	go l.renew(rctx, a)
	return l, nil
}

func (l *lease) renew(ctx context.Context, a *App) {
	defer close(l.done)
	t := time.NewTicker(embeddedLockTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kick:
		}
		l.clock.Sync(ctx)
		now := l.clock.Now()
		// Each call bounded: a connection that hangs must not let the
		// lease lapse unnoticed.
		cctx, cancel := context.WithTimeout(ctx, embeddedLockTTL/3)
		err := l.ex.LockRenew(cctx, &driver.LockRenewParams{Name: l.name, Owner: l.owner, Until: now.Add(embeddedLockTTL)})
		if errors.Is(err, driver.ErrLeaseLost) {
			// Lapsed after we failed to renew in time (a database
			// outage): take it back if it is free.
			var ok bool
			ok, err = l.ex.LockAcquire(cctx, &driver.LockAcquireParams{Name: l.name, Owner: l.owner, Now: now, Until: now.Add(embeddedLockTTL)})
			if err == nil && !ok {
				cancel()
				// Another idemd took it: two embedded brokers would
				// split the events of one database. This one stops.
				a.fail(fmt.Errorf("embedded broker: lease %s taken by another idemd while this one could not renew it: %w", l.name, errLeaseTaken))
				return
			}
		}
		cancel()
		if err == nil {
			l.validUntil.Store(now.Add(embeddedLockTTL).UnixNano())
		}
		if err != nil && ctx.Err() == nil {
			a.log.Error("embedded broker: lease renewal failed", "lease", l.name, "err", err)
		}
	}
}

// release stops the renewal and deletes the lease, so that a restart takes
// it at once.
func (l *lease) release() {
	l.stop()
	<-l.done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.ex.LockRelease(ctx, &driver.LockReleaseParams{Name: l.name, Owner: l.owner})
}

// expireRelayLease expires the relay lease (outbox.RelayLockName, taken on
// a database without concurrent writers: SQLite) that an idemd killed
// without releasing it left behind. It is called with the embedded
// broker's lease held, so no other idemd runs on this database: without
// it, this idemd's relay would stand by, publishing nothing, until the
// dead one's lease expired.
func expireRelayLease(ctx context.Context, a *App, ex driver.LockExecutor) error {
	holder, _, err := ex.LockGet(ctx, &driver.LockGetParams{Name: outbox.RelayLockName})
	if errors.Is(err, driver.ErrNotFound) {
		return nil
	}
	if err == nil {
		err = expireLease(ctx, ex, outbox.RelayLockName, holder, time.Now()) // the relay's clock
	}
	if err != nil {
		return fmt.Errorf("lease %s: %w", outbox.RelayLockName, err)
	}
	a.log.Info("outbox: expired the relay lease a stopped idemd left", "lease", outbox.RelayLockName, "holder", holder)
	return nil
}

// expireLease makes holder's lease name expired at now (the clock of the
// next LockAcquire), so that the next LockAcquire takes it. A lease that
// holder no longer has (released, expired and taken) is fine.
func expireLease(ctx context.Context, ex driver.LockExecutor, name, holder string, now time.Time) error {
	err := ex.LockRenew(ctx, &driver.LockRenewParams{Name: name, Owner: holder, Until: now.Add(-time.Second)})
	if errors.Is(err, driver.ErrLeaseLost) {
		return nil
	}
	return err
}

// holderOnThisHost reports whether owner ("host/pid/random/pidns") names
// a process this one can see (same host name and PID namespace), and
// whether that process is gone (or a zombie), or is this very process's PID (which
// cannot hold the lease yet: a restart reused it). Two containers may share
// a host name (host networking, a fixed hostname) and each run as PID 1;
// without a PID namespace to compare (not Linux), a holder is never taken
// for local: it is waited for until its lease expires.
func holderOnThisHost(owner, host string) (local, dead bool) {
	parts := strings.Split(owner, "/")
	ns := pidNamespace()
	if len(parts) != 4 || parts[0] != host || ns == "" || parts[3] != ns {
		return false, false
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 {
		return false, false
	}
	if pid == os.Getpid() {
		return true, true
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return true, true
	}
	if err = p.Signal(syscall.Signal(0)); err != nil {
		return true, !errors.Is(err, syscall.EPERM)
	}
	return true, zombie(pid)
}

// zombie reports whether the process pid has exited but was not reaped by
// its parent yet (Linux: state Z or X in /proc/PID/stat). Signal 0 still
// reaches such a process, and a parent that never calls wait (a shell
// script, a container's PID 1 without an init) keeps it for good.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "PID (comm) S ...": comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'Z' || b[i+2] == 'X'
}

// pidNamespace names this process's PID namespace on this boot of this
// machine (Linux: the link /proc/self/ns/pid, "pid:[4026531836]", which is
// the same on every machine's root namespace, and the kernel's random
// boot_id), "" when unknown.
func pidNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.NewReplacer("/", "_", ":", "_").Replace(ns + "@" + strings.TrimSpace(string(boot)))
}

// setRetention sets retention.ms on topics of the embedded broker. It is
// set at every start: the broker applies retention only to topics whose
// configuration was set since it started.
// ensureTopics creates topic (EmbeddedPartitions partitions) and its
// dead-letter topic (1) in the embedded broker when they are missing. In a
// log of this database (not fresh) that holds other topics, a missing
// topic means -kafka-topic changed: a *ConfigError naming the log's
// topics, since switching would strand the events published into the old
// one that no consumer read yet.
func ensureTopics(ctx context.Context, cluster *kfake.Cluster, fresh bool, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return fmt.Errorf("embedded broker: list topics: %w", err)
	}
	dlq := topic + idemkafka.DeadLetterSuffix
	if !fresh && !topics.Has(topic) && len(topics.Names()) > 0 {
		return configErrorf("-kafka-topic %q: the embedded broker's log holds the topics %s of this database, not %q: "+
			"start with the -kafka-topic it was written with (its unread events are there), or move the log away to start a new one",
			topic, strings.Join(topics.Names(), ", "), topic)
	}
	for _, t := range []struct {
		name       string
		partitions int32
	}{{topic, EmbeddedPartitions}, {dlq, 1}} {
		if topics.Has(t.name) {
			continue
		}
		res, err := adm.CreateTopic(ctx, t.partitions, 1, nil, t.name)
		if err == nil {
			err = res.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("embedded broker: create topic %s: %w", t.name, err)
		}
	}
	return nil
}

func setRetention(ctx context.Context, cluster *kfake.Cluster, d time.Duration, topics ...string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		return err
	}
	defer cl.Close()
	v := strconv.FormatInt(d.Milliseconds(), 10)
	res, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &v}}, topics...)
	if err == nil {
		for _, r := range res {
			if r.Err != nil {
				err = errors.Join(err, fmt.Errorf("topic %s: retention.ms: %w", r.Name, r.Err))
			}
		}
	}
	return err
}

// errLeaseUnsure is the outcome of the events a fencedPublisher did not
// publish, or published without the lease surely held: the relay retries
// them at a later round without counting a failed attempt (see
// outbox.ErrSkipped).
var errLeaseUnsure = fmt.Errorf("%w: embedded broker: this idemd's lease (%s) is not surely held: its renewals failed, or this process was frozen; not publishing into its broker until a renewal succeeds",
	outbox.ErrSkipped, EmbeddedLock)

// fencedPublisher is the relay's publisher into the embedded broker: it
// publishes a batch only while the broker's lease surely holds (it has
// embeddedPublishGuard left to run), and reports a batch as published only
// if that was still so once the broker acknowledged it. A process frozen
// past its lease (a long GC or memory stall, a VM migration, SIGSTOP) may
// have lost it to an idemd on another host, which redrives the outbox into
// its own log: events published here then, and marked published, would
// reach no consumer. Without this, the resumed process published and
// marked the events it found before its next renewal said the lease was
// taken. What remains unfenced is a pause between the check after the
// broker's acknowledgement and the COMMIT of the marks, longer than the
// guard: the lease is a row, not a fencing token the marks' transaction
// checks.
type fencedPublisher struct {
	pub   outbox.LatePublisher
	lease *lease
	now   func() time.Time
}

// newFencedPublisher fences pub with l. It reads l's own clock (the host's
// corrected by the database's): the lease's validUntil is on that clock,
// and the host's alone, off by more than the guard, would stop (or never
// stop) the relay.
func newFencedPublisher(pub outbox.LatePublisher, l *lease) *fencedPublisher {
	return &fencedPublisher{pub: pub, lease: l, now: l.clock.Now}
}

// held reports whether the lease surely holds; if not, it asks for a
// renewal at once, so that the relay's next round (after its backoff)
// finds it renewed if the database answers.
func (p *fencedPublisher) held() bool {
	if p.lease.held(p.now(), embeddedPublishGuard) {
		return true
	}
	select {
	case p.lease.kick <- struct{}{}:
	default:
	}
	return false
}

// unsure is the outcome of every event of a batch of n.
func unsure(n int) error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = errLeaseUnsure
	}
	return &outbox.PublishError{Errs: errs}
}

func (p *fencedPublisher) Publish(ctx context.Context, events []event.Envelope) error {
	if !p.held() {
		return unsure(len(events))
	}
	err := p.pub.Publish(ctx, events)
	if !p.held() {
		return unsure(len(events))
	}
	return err
}

func (p *fencedPublisher) PublishLate(ctx context.Context, events []event.Envelope, late func(i int, err error)) error {
	if !p.held() {
		return unsure(len(events))
	}
	err := p.pub.PublishLate(ctx, events, func(i int, err error) {
		if err == nil && !p.held() {
			err = errLeaseUnsure
		}
		late(i, err)
	})
	if !p.held() {
		return unsure(len(events))
	}
	return err
}

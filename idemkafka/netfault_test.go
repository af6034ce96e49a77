package idemkafka_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
)

// isEffectInsert matches the handler's INSERT of its effect.
func isEffectInsert(b []byte) bool { return bytes.Contains(b, []byte("INSERT INTO effect")) }

// blackHoledConsumer starts a consumer on PostgreSQL through a fault proxy
// with TxTimeout txTimeout, whose handler's first effect INSERT is
// black-holed: the connection forwards nothing from then on, either way,
// and neither side is closed (a partition that resets nothing: a failover
// behind a load balancer or NAT, a firewall that lost the connection's
// state). It returns once the fault fired. With endOnTerminate, the proxy
// closes the connection's client side on the Terminate that gives it up
// (testdb.Proxy.EndOnTerminate) instead of letting pgx drain it for 15 s.
func blackHoledConsumer(t *testing.T, txTimeout time.Duration, endOnTerminate bool) (b *backend[pgx.Tx], kc *kafkatest.Cluster,
	topic, group string, evs []event.Envelope, inst *instance, fault *testdb.Faulted, errs *errLog) {
	t.Helper()
	b = setupPostgres(t)
	kc = kafkatest.New(t)
	topic, group = consumedTopic(t, kc, 1)
	evs = newEvents(t, 20, 4)

	proxy := testdb.NewProxy(t)
	if endOnTerminate {
		proxy.EndOnTerminate()
	}
	schema := strings.TrimPrefix(b.env[1], envTarget+"=")
	drv, err := pgdriver.New(proxy.Pool(t, schema, 4), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	fault = proxy.Arm(testdb.BlackHole, isEffectInsert)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.TxTimeout = txTimeout
	errs = &errLog{}
	cfg.OnBatch = func(_ context.Context, s idemkafka.BatchStats) { errs.add(s.Err) }
	inst = startWith(t, drv, in, cfg)
	t.Cleanup(fault.Cut) // first: a consumer still waiting on it goes on
	select {
	case <-fault.Fired():
	case <-time.After(30 * time.Second):
		t.Fatal("no effect INSERT went through the proxy")
	}
	return b, kc, topic, group, evs, inst, fault, errs
}

// errLog keeps the errors of a consumer's batches.
type errLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errLog) add(err error) {
	if err != nil {
		l.mu.Lock()
		l.errs = append(l.errs, err)
		l.mu.Unlock()
	}
}

func (l *errLog) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, err := range l.errs {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}

// A consumer whose database connection stops answering in the middle of a
// batch's transaction gives the transaction up within TxTimeout (closing
// its connection, reporting the failure), retries the batch as a database
// failure (never dead-lettered), and once PostgreSQL sees the old
// connection gone (the path back, or its TCP keepalive), applies every
// event once. Before TxTimeout the consumer waited as long as TCP does
// (for ever behind this proxy, which acknowledges), and logged nothing.
func TestConsumerGivesUpABlackHoledTransaction(t *testing.T) {
	t.Parallel()
	const txTimeout = 2 * time.Second
	// What is tested is that the consumer gives the connection up, not
	// how long pgx then drains it.
	b, kc, topic, group, evs, inst, fault, errs := blackHoledConsumer(t, txTimeout, true)
	fired := time.Now()
	waitFor(t, 10*txTimeout, "a batch failure naming TxTimeout", func() bool { return errs.has("TxTimeout") })
	t.Logf("the consumer reported the failure %s after the fault", time.Since(fired).Round(time.Millisecond))
	select {
	case <-fault.ClientClosed():
		t.Logf("the consumer gave the connection up %s after the fault", time.Since(fired).Round(time.Millisecond))
	case <-time.After(txTimeout + 30*time.Second):
		// pgx closes a connection whose deadline passed after sending
		// it a Terminate and waiting up to 15 s for the server to close it
		// (the proxy closes it on the Terminate).
		t.Fatalf("the consumer still held its black-holed connection %s after the fault (TxTimeout %s)", txTimeout+30*time.Second, txTimeout)
	}
	fault.Cut() // PostgreSQL ends the old session: its transaction rolls back
	waitFor(t, 60*time.Second, "committed after the fault", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)
	if s := inst.stats.get(); s.dead != 0 || s.failures == 0 {
		t.Errorf("dead-lettered %d, failures %d; want 0 and > 0", s.dead, s.failures)
	}
}

// Stopping a consumer whose transaction waits on a black-holed connection:
// Run returns within TxTimeout and the COMMIT's grace, instead of waiting
// as long as TCP does.
func TestConsumerStopsDuringABlackHoledTransaction(t *testing.T) {
	t.Parallel()
	const txTimeout = 2 * time.Second
	b, _, _, _, evs, inst, fault, _ := blackHoledConsumer(t, txTimeout, false)
	started := time.Now()
	if err := inst.stop(); err != nil {
		t.Fatalf("stop: %v (TxTimeout %s)", err, txTimeout)
	}
	t.Logf("Run returned %s after its context ended", time.Since(started).Round(time.Millisecond))
	if took := time.Since(started); took > txTimeout+15*time.Second {
		t.Errorf("Run returned %s after its context ended; want within TxTimeout %s and the commit's grace", took, txTimeout)
	}
	fault.Cut()
	if n := distinct(t, b, "billing"); n >= len(evs) {
		t.Errorf("%d events applied; the fault should have stopped the batch", n)
	}
}

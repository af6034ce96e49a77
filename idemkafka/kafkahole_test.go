package idemkafka_test

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

// holeDialer dials brokers for a kgo client and can black-hole every
// connection it made (BlackHoleAll): from then on what the client writes
// is swallowed and nothing is read, and neither side is closed (a
// partition that resets nothing, a NAT or firewall that lost the
// connections' state), while new connections work.
type holeDialer struct {
	mu    sync.Mutex
	conns []*holeConn
}

func (d *holeDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	hc := &holeConn{Conn: c, holed: make(chan struct{}), closed: make(chan struct{})}
	d.mu.Lock()
	d.conns = append(d.conns, hc)
	d.mu.Unlock()
	return hc, nil
}

// BlackHoleAll black-holes the connections made so far and returns how
// many.
func (d *holeDialer) BlackHoleAll() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.hole()
	}
	n := len(d.conns)
	d.conns = nil
	return n
}

type holeConn struct {
	net.Conn
	holed, closed       chan struct{}
	holeOnce, closeOnce sync.Once
	mu                  sync.Mutex
	readDeadline        time.Time
}

func (c *holeConn) hole() {
	c.holeOnce.Do(func() {
		close(c.holed)
		_ = c.Conn.SetReadDeadline(time.Unix(1, 0)) // a Read under way returns, and waits below
	})
}

func (c *holeConn) isHoled() bool {
	select {
	case <-c.holed:
		return true
	default:
		return false
	}
}

func (c *holeConn) Read(b []byte) (int, error) {
	if !c.isHoled() {
		n, err := c.Conn.Read(b)
		if !c.isHoled() {
			return n, err
		}
	}
	// Nothing arrives: wait for the client's read deadline, or its Close.
	c.mu.Lock()
	dl := c.readDeadline
	c.mu.Unlock()
	var timeout <-chan time.Time
	if !dl.IsZero() {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	case <-timeout:
		return 0, os.ErrDeadlineExceeded
	}
}

func (c *holeConn) Write(b []byte) (int, error) {
	if c.isHoled() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *holeConn) SetDeadline(t time.Time) error {
	_ = c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

func (c *holeConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline = t
	c.mu.Unlock()
	if c.isHoled() {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *holeConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// A consumer whose broker connections are all black-holed at once goes on
// consuming over new connections within a bounded time, and every event
// takes effect once.
func TestConsumerGoesOnAfterItsBrokerConnectionsAreBlackHoled(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 2)
	evs := newEvents(t, 40, 8)
	d := &holeDialer{}
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	// A JoinGroup sent on a black-holed connection is given up after the
	// rebalance timeout plus kgo's request overhead (60 s + 10 s by
	// default): 5 s + 2 s here.
	cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.Dialer(d.Dial), kgo.RebalanceTimeout(5*time.Second), kgo.RequestTimeoutOverhead(2*time.Second))
	inst := start(t, b, "billing", cfg)
	kc.Produce(t, topic, recordsOf(topic, evs[:20]...)...)
	waitFor(t, 30*time.Second, "the first events committed", func() bool { return allCommitted(t, kc, group, topic) })
	n := d.BlackHoleAll()
	kc.Produce(t, topic, recordsOf(topic, evs[20:]...)...)
	started := time.Now()
	waitFor(t, 60*time.Second, "the events produced after the fault committed", func() bool { return allCommitted(t, kc, group, topic) })
	t.Logf("%d broker connections black-holed: the events produced after committed within %s", n, time.Since(started).Round(time.Millisecond))
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)
}

// A relay whose publisher's broker connections are all black-holed at once
// publishes the events enqueued after the fault over new connections,
// within kgo's produce request timeout (ProduceRequestTimeout plus
// RequestTimeoutOverhead, 10 s + 10 s by default) and the relay's backoff,
// none parked, none lost.
func TestRelayGoesOnAfterItsBrokerConnectionsAreBlackHoled(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 2)
	d := &holeDialer{}
	r := newRelayRig(t, kc, topic, outbox.RelayConfig{PollInterval: 50 * time.Millisecond}, kgo.Dialer(d.Dial))
	r.run(t)
	evs := newEvents(t, 40, 8)
	r.enqueue(t, evs[:20]...)
	waitFor(t, 30*time.Second, "the first events published", func() bool { p, _, _ := r.count(t); return p == 20 })
	n := d.BlackHoleAll()
	started := time.Now()
	r.enqueue(t, evs[20:]...)
	waitFor(t, 60*time.Second, "the events enqueued after the fault published", func() bool { p, _, _ := r.count(t); return p == 40 })
	t.Logf("%d broker connections black-holed: the events enqueued after published within %s", n, time.Since(started).Round(time.Millisecond))
	if _, parked, _ := r.count(t); parked != 0 {
		t.Errorf("%d events parked", parked)
	}
	got := map[string]bool{}
	for _, rec := range kc.Records(t, topic) {
		e, err := idemkafka.Envelope(rec)
		if err != nil {
			t.Fatal(err)
		}
		got[e.ID.String()] = true
	}
	for _, e := range evs {
		if !got[e.ID.String()] {
			t.Errorf("event %s not in the topic", e.ID)
		}
	}
}

package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// holeProxy forwards TCP connections to PostgreSQL until blackHole is
// called: from then on the connections it carries forward nothing, either
// way, and close nothing (a partition that resets nothing: the primary's
// host gone in a failover, a NAT or firewall that lost the connection's
// state), while new connections go through.
type holeProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	holes []*atomic.Bool
	conns []net.Conn
}

func newHoleProxy(t *testing.T, target string) *holeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	return p
}

func (p *holeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		hole := new(atomic.Bool)
		p.mu.Lock()
		p.holes = append(p.holes, hole)
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if err != nil {
					_ = dst.Close()
					_ = src.Close()
					return
				}
				if hole.Load() {
					continue // swallowed
				}
				if _, err := dst.Write(buf[:n]); err != nil {
					_ = src.Close()
					return
				}
			}
		}
		go pipe(s, c)
		go pipe(c, s)
	}
}

// blackHole makes every connection the proxy carries now forward nothing.
func (p *holeProxy) blackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range p.holes {
		h.Store(true)
	}
}

// A relay whose pooled connections were cut off without a reset (the
// primary's host gone in a failover, a NAT or firewall losing the
// connections' state) waited on them for as long as TCP took to give up,
// or for ever when a middlebox kept acknowledging: its round's Begin and
// claim ran on Run's context, without a deadline, so the relay published
// nothing, and said nothing, while new connections worked. The claim is
// now bounded: the round fails (and is logged), and the next one takes a
// new connection.
func TestRunRecoversFromABlackHoledConnection(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		direct, schema := testdb.Schema(t, 2)
		p := newHoleProxy(t, target)
		pcfg, err := pgxpool.ParseConfig(testdb.DSN())
		if err != nil {
			t.Fatal(err)
		}
		pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = "127.0.0.1", uint16(p.ln.Addr().(*net.TCPAddr).Port)
		pcfg.ConnConfig.Fallbacks = nil
		pcfg.ConnConfig.RuntimeParams["search_path"] = schema
		pcfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		enq, err := pgdriver.New(direct, &pgdriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		testRecoversFromABlackHole(t, drv, enq, p)
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		_, schema := testdb.Schema(t, 1)
		p := newHoleProxy(t, target)
		dcfg := cfg.Copy()
		dcfg.Host, dcfg.Port = "127.0.0.1", uint16(p.ln.Addr().(*net.TCPAddr).Port)
		dcfg.Fallbacks = nil
		dcfg.RuntimeParams["search_path"] = schema
		db := stdlib.OpenDB(*dcfg)
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { _ = db.Close() })
		drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		enq, err := pgsqldriver.New(testdb.SQLPool(t, schema, 2), &pgsqldriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		testRecoversFromABlackHole[*sql.Tx](t, drv, enq, p)
	})
}

func testRecoversFromABlackHole[TTx any](t *testing.T, drv, enq driver.OutboxDriver[TTx], p *holeProxy) {
	published := make(chan event.Envelope, 10)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		NoListen: true, Concurrency: 1, PollInterval: 20 * time.Millisecond,
		OnPublished: func(es []event.Envelope) { // marks committed
			for _, e := range es {
				published <- e
			}
		},
		OnLag:  func(time.Duration) {}, // its query too must not hang on a black-holed connection
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = relay.Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	wait := func(e event.Envelope, within time.Duration, what string) {
		t.Helper()
		select {
		case got := <-published:
			if got.ID != e.ID {
				t.Fatalf("published %s, want %s", got.ID, e.ID)
			}
		case <-time.After(within):
			t.Fatalf("%s: not published within %s", what, within)
		}
	}
	first := mustEvent(t, "k")
	enqueueTx(t, enq, first)
	wait(first, 10*time.Second, "before the partition")

	p.blackHole() // the relay's pooled connections are cut off
	second := mustEvent(t, "k")
	enqueueTx(t, enq, second)
	wait(second, 45*time.Second, "after the relay's connections were black-holed (new connections work)")
}

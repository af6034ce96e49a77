package testdb

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Proxy is a TCP proxy between a test's connections and PostgreSQL, to
// break one connection at a chosen message from the client: a network
// partition or a hung server that closes nothing (BlackHole,
// BlackHoleReply), or a reply lost with the connection (DropReply); or
// every connection it carries at once (BlackHoleAll). Its connections to
// PostgreSQL take connection slots like the others of this package.
type Proxy struct {
	ln       net.Listener
	network  string // PostgreSQL's
	upstream string

	mu     sync.Mutex
	armed  *Faulted
	conns  map[*proxyConn]struct{}
	closed bool

	endOnTerminate atomic.Bool // see EndOnTerminate
}

// Fault is what a Proxy does to the connection whose client sent the bytes
// an armed fault matches.
type Fault int

const (
	// BlackHole: the matching bytes are not forwarded, nor anything else
	// of the connection from then on, either way, and neither side is
	// closed: the server never gets them (a partition that resets
	// nothing, a server that hangs before reading them).
	BlackHole Fault = iota
	// BlackHoleReply: the matching bytes reach the server, then nothing
	// of the connection is forwarded, either way, and neither side is
	// closed: the server executes them, the client never hears back.
	BlackHoleReply
	// DropReply: the matching bytes reach the server; its reply, up to
	// its ReadyForQuery, is dropped, and both sides are closed: the server
	// executed them, and the client sees its connection break instead of
	// the answer.
	DropReply
	// CutAfterCommit: the matching bytes reach the server; its reply is
	// forwarded up to and including the CommandComplete of a COMMIT, then
	// both sides are closed: the client hears the COMMIT succeed and
	// loses the connection before the answers to the statements it
	// pipelined after the COMMIT.
	CutAfterCommit
)

// Faulted is an armed fault.
type Faulted struct {
	kind  Fault
	match func([]byte) bool

	fired        chan struct{} // closed when it fired
	clientClosed chan struct{} // closed when the client closed its side, after it fired
	pc           *proxyConn    // set when it fired
}

// Fired is closed when the fault fired.
func (f *Faulted) Fired() <-chan struct{} { return f.fired }

// ClientClosed is closed when the client closed its side of the faulted
// connection (it gave the connection up), which the server does not see
// (BlackHole, BlackHoleReply) until Cut.
func (f *Faulted) ClientClosed() <-chan struct{} { return f.clientClosed }

// Cut closes both sides of the faulted connection (nothing when the fault
// has not fired): the server sees its client gone, as when its TCP
// keepalive gives up or the partition heals and the client's FIN gets
// through, and ends the session, rolling back what it had not committed.
func (f *Faulted) Cut() {
	select {
	case <-f.fired:
		f.pc.close()
	default:
	}
}

// NewProxy starts a proxy to the test database (DSN), stopped when the
// test ends.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	RequirePostgres(t)
	cfg, err := pgx.ParseConfig(DSN())
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	p := &Proxy{network: "tcp", upstream: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))),
		conns: map[*proxyConn]struct{}{}}
	if len(cfg.Host) > 0 && cfg.Host[0] == '/' {
		p.network, p.upstream = "unix", cfg.Host+"/.s.PGSQL."+strconv.Itoa(int(cfg.Port))
	}
	p.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	t.Cleanup(func() {
		_ = p.ln.Close()
		<-done
		p.mu.Lock()
		p.closed = true
		conns := p.conns
		p.conns = nil
		p.mu.Unlock()
		for pc := range conns {
			pc.close()
		}
	})
	return p
}

// EndOnTerminate makes the proxy close the client's side of a faulted
// connection (BlackHole, BlackHoleReply, BlackHoleAll) as soon as the
// client sends it a Terminate, the message a client sends when it gives a
// connection up, as a server that read it would: ClientClosed is closed at
// once. Without it the client waits for a close that never comes: pgx,
// after a cancel request, drains a connection it gave up for up to 15 s,
// and its pool counts it, and its Close waits for it, until then. It is
// for the tests that check that the client gives the connection up, not
// how long pgx then waits; the server still sees nothing until Cut.
func (p *Proxy) EndOnTerminate() { p.endOnTerminate.Store(true) }

// terminate is the Terminate message of the PostgreSQL protocol.
var terminate = []byte{'X', 0, 0, 0, 4}

// Arm arms a fault for the next chunk of bytes a client sends, on any
// connection, that match accepts. It fires once; arming another replaces
// one that has not fired.
func (p *Proxy) Arm(kind Fault, match func(clientBytes []byte) bool) *Faulted {
	f := &Faulted{kind: kind, match: match, fired: make(chan struct{}), clientClosed: make(chan struct{})}
	p.mu.Lock()
	p.armed = f
	p.mu.Unlock()
	return f
}

// BlackHoleAll black-holes every connection the proxy carries now, as a
// BlackHole fault that fired on each: from now on they forward nothing,
// either way, and close nothing (a partition that resets nothing, taking
// every connection at once: the primary's host gone in a failover, a NAT
// or firewall that lost the connections' state), while connections made
// afterwards go through. It returns those faults, fired, one per
// connection. A chunk a connection was forwarding as it was called may
// still get through.
func (p *Proxy) BlackHoleAll() []*Faulted {
	p.mu.Lock()
	defer p.mu.Unlock()
	var fs []*Faulted
	for pc := range p.conns {
		if pc.cut.Load() || pc.state.Load() != forwarding {
			continue
		}
		f := &Faulted{kind: BlackHole, fired: make(chan struct{}), clientClosed: make(chan struct{}), pc: pc}
		close(f.fired)
		pc.fault = f // before the state: toServer reads it once it sees the state
		pc.state.Store(blackHoled)
		fs = append(fs, f)
	}
	return fs
}

// ConnConfig is the connection configuration of DSN through the proxy,
// with search_path schema and without TLS (the proxy reads the messages).
func (p *Proxy) ConnConfig(t testing.TB, schema string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(DSN())
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.TLSConfig, cfg.Fallbacks = nil, nil
	cfg.RuntimeParams["search_path"] = schema
	addr := p.ln.Addr().String()
	cfg.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}
	return cfg
}

// Pool opens a pool through the proxy whose search_path is schema. It is
// closed when the test ends.
func (p *Proxy) Pool(t testing.TB, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DSN())
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.ConnConfig = p.ConnConfig(t, schema)
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// proxyConn is one client connection and its connection to PostgreSQL.
type proxyConn struct {
	client, server net.Conn
	// state: forwarding, or the fault that fired on it.
	state     atomic.Int32
	fault     *Faulted
	cut       atomic.Bool // closed by the proxy
	closeOnce sync.Once
}

const (
	forwarding int32 = iota
	blackHoled
	droppingReply
	cuttingAfterCommit
)

func (pc *proxyConn) close() {
	pc.closeOnce.Do(func() {
		pc.cut.Store(true)
		_ = pc.client.Close()
		_ = pc.server.Close()
	})
}

func (p *Proxy) serve(client net.Conn) {
	server, err := dial(context.Background(), p.network, p.upstream)
	if err != nil {
		_ = client.Close()
		return
	}
	pc := &proxyConn{client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		pc.close()
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()
	go p.toClient(pc)
	p.toServer(pc)
}

// toServer forwards what the client sends until a fault fires on it.
func (p *Proxy) toServer(pc *proxyConn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := pc.client.Read(buf)
		if err != nil {
			if pc.state.Load() == forwarding {
				pc.close()
			} else if !pc.cut.Load() {
				// The client gave the connection up; the server, behind
				// the fault, does not see it.
				close(pc.fault.clientClosed)
			}
			return
		}
		b := buf[:n]
		if pc.state.Load() != forwarding {
			// Black-holed (the other faults close both sides).
			if p.endOnTerminate.Load() && bytes.HasSuffix(b, terminate) {
				_ = pc.client.Close() // the next Read fails: clientClosed
			}
			continue
		}
		if f := p.fire(pc, b); f != nil {
			switch f.kind {
			case BlackHole:
				pc.state.Store(blackHoled)
				close(f.fired)
				continue
			case BlackHoleReply:
				pc.state.Store(blackHoled)
			case DropReply:
				pc.state.Store(droppingReply)
			case CutAfterCommit:
				pc.state.Store(cuttingAfterCommit)
			}
			close(f.fired)
		}
		if _, err := pc.server.Write(b); err != nil {
			pc.close()
			return
		}
	}
}

// fire takes the armed fault if b matches it.
func (p *Proxy) fire(pc *proxyConn, b []byte) *Faulted {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.armed
	if f == nil || pc.state.Load() != forwarding || !f.match(b) {
		return nil // (not forwarding: BlackHoleAll took it)
	}
	p.armed = nil
	f.pc, pc.fault = pc, f
	return f
}

// toClient forwards what the server sends, except behind a fault.
func (p *Proxy) toClient(pc *proxyConn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := pc.server.Read(buf)
		if err != nil {
			if pc.state.Load() == forwarding {
				pc.close()
			}
			return
		}
		b := buf[:n]
		switch pc.state.Load() {
		case blackHoled:
			continue
		case droppingReply:
			if readyForQuery(b) {
				pc.close()
				return
			}
			continue
		case cuttingAfterCommit:
			if i := bytes.Index(b, commitComplete); i >= 0 {
				_, _ = pc.client.Write(b[:i+len(commitComplete)])
				pc.close()
				return
			}
		}
		if _, err := pc.client.Write(b); err != nil {
			pc.close()
			return
		}
	}
}

// commitComplete is the CommandComplete message of a COMMIT.
var commitComplete = []byte{'C', 0, 0, 0, 11, 'C', 'O', 'M', 'M', 'I', 'T', 0}

// readyForQuery reports whether b ends with a ReadyForQuery message.
func readyForQuery(b []byte) bool {
	return len(b) >= 6 && bytes.Equal(b[len(b)-6:len(b)-1], []byte{'Z', 0, 0, 0, 5})
}

package app_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"

	"github.com/idemkit/idem/internal/app"
)

// Replicas started together on a fresh PostgreSQL database (a Deployment's
// first rollout) all start: their migrations (idem's, the domains',
// the instance ID's) take turns instead of racing on CREATE TABLE, which
// PostgreSQL fails with a unique violation on pg_type's index.
func TestReplicasStartTogether(t *testing.T) {
	t.Parallel()
	for range 3 {
		dbArg, _ := dbSetting(t, app.Postgres)
		cfg, err := app.ParseConfig([]string{"-db", dbArg, "-kafka", "off"}, envOf(nil))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 4 {
			wg.Go(func() {
				<-start
				a, err := app.New(context.Background(), cfg, newTestLogger(io.Discard))
				if err != nil {
					t.Errorf("replica %d: %v", i, err)
					return
				}
				a.Close()
			})
		}
		close(start)
		wg.Wait()
	}
}

// downProxy forwards connections to target until down, which closes them
// all and refuses new ones until up: a database restarting.
type downProxy struct {
	t            *testing.T
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        []net.Conn
}

func newDownProxy(t *testing.T, target string) *downProxy {
	p := &downProxy{t: t, addr: "127.0.0.1:0", target: target}
	p.up()
	p.addr = p.ln.Addr().String()
	t.Cleanup(p.down)
	return p
}

func (p *downProxy) up() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
}

func (p *downProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Readiness follows the database: /healthz answers 503 while it is down
// and 200 again at the first probe once it is back, without a restart;
// liveness answers 200 throughout.
func TestHealthzFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	dbArg, _ := dbSetting(t, app.Postgres)
	u, err := url.Parse(dbArg)
	if err != nil {
		t.Fatal(err)
	}
	p := newDownProxy(t, u.Host)
	u.Host = p.addr
	cfg, err := app.ParseConfig([]string{"-db", u.String(), "-kafka", "off", "-cleanup", "off"}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(context.Background(), cfg, newTestLogger(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(func() { srv.Close(); a.Close() })
	probe := func(path string) int {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		_ = res.Body.Close()
		return res.StatusCode
	}
	if h, l := probe("/healthz"), probe("/livez"); h != http.StatusOK || l != http.StatusOK {
		t.Fatalf("database up: healthz %d, livez %d; want 200, 200", h, l)
	}
	p.down()
	for range 3 {
		if h, l := probe("/healthz"), probe("/livez"); h != http.StatusServiceUnavailable || l != http.StatusOK {
			t.Errorf("database down: healthz %d, livez %d; want 503, 200", h, l)
		}
	}
	p.up()
	if h, l := probe("/healthz"), probe("/livez"); h != http.StatusOK || l != http.StatusOK {
		t.Errorf("database back: healthz %d, livez %d; want 200, 200", h, l)
	}
}

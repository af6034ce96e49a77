package app_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/problem"
)

// countingListener counts the bytes the server reads from its
// connections.
type countingListener struct {
	net.Listener
	read *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.read}, nil
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// spaces is an endless body of JSON whitespace.
type spaces struct{}

func (spaces) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	return len(p), nil
}

// 50 clients upload a 100 MB body each to POST /v1/payments at once. Each
// gets 413 body-too-large (problem+json), or, still sending when the
// server closed the connection, a reset; the server read little more than
// the endpoint's 64 KiB limit of each body, not its 100 MB; the heap stays
// within 1 MiB per upload, and nothing is stored. On both
// databases (the body is refused before the store is touched). Not
// parallel: the heap is the process's, and another test's allocations
// (run in parallel, it grew by 369 MiB once) are not the uploads'.
func TestHugeConcurrentUploadsBounded(t *testing.T) {
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			dbArg, count := dbSetting(t, kind)
			cfg, err := app.ParseConfig([]string{"-db", dbArg, "-kafka", "off"}, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			a, err := app.New(t.Context(), cfg, newTestLogger(io.Discard))
			if err != nil {
				t.Fatal(err)
			}
			var read atomic.Int64
			srv := httptest.NewUnstartedServer(a.Handler())
			srv.Listener = countingListener{srv.Listener, &read}
			srv.Start()
			t.Cleanup(func() { srv.Close(); a.Close() })

			const (
				clients = 50
				size    = 100 << 20
			)
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			// The peak of the heap while the uploads run, sampled.
			var peak atomic.Uint64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				var ms runtime.MemStats
				for {
					runtime.ReadMemStats(&ms)
					if ms.HeapAlloc > peak.Load() {
						peak.Store(ms.HeapAlloc)
					}
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()
			type answer struct {
				status int
				typ    string
				err    error
			}
			answers := make([]answer, clients)
			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() {
					req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/payments", io.LimitReader(spaces{}, size))
					if err != nil {
						answers[i].err = err
						return
					}
					req.ContentLength = size
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", "huge")
					res, err := (&http.Client{Timeout: time.Minute, Transport: &http.Transport{}}).Do(req)
					if err != nil {
						answers[i].err = err
						return
					}
					defer res.Body.Close()
					b, _ := io.ReadAll(res.Body)
					answers[i] = answer{status: res.StatusCode, typ: response{status: res.StatusCode, header: res.Header, body: b}.problemType(t)}
				})
			}
			wg.Wait()
			close(stop)
			<-sampled
			refused, reset := 0, 0
			for i, an := range answers {
				switch {
				case an.err == nil && an.status == http.StatusRequestEntityTooLarge && an.typ == problem.TypeBodyTooLarge:
					refused++
				case errors.Is(an.err, syscall.ECONNRESET) || errors.Is(an.err, syscall.EPIPE):
					// net/http closes a connection whose body it did not
					// read (after its 500 ms against a reset): a client
					// still sending then may lose the 413 to the reset
					// (TCP), as with any server that does not read a
					// refused body to its end.
					reset++
				default:
					t.Errorf("upload %d: %d %s (err %v), want 413 %s", i, an.status, an.typ, an.err, problem.TypeBodyTooLarge)
				}
			}
			if refused == 0 {
				t.Errorf("no upload got the 413 (%d connections reset)", reset)
			}
			// What the server read: each body's first 64 KiB and what the
			// socket buffers held when it answered, never the 5 GB sent.
			if got, limit := read.Load(), int64(clients)*(8<<20); got > limit {
				t.Errorf("the server read %d MiB of the uploads, want at most %d MiB (8 MiB each)", got>>20, limit>>20)
			}
			grown := int64(peak.Load()) - int64(before.HeapAlloc)
			if limit := int64(clients) * (1 << 20); grown > limit {
				t.Errorf("the heap grew by %d MiB during the uploads, want at most %d MiB (1 MiB each)", grown>>20, limit>>20)
			}
			t.Logf("%d uploads answered 413, %d reset; the server read %d KiB in all; heap peak %+d KiB", refused, reset, read.Load()>>10, grown>>10)
			if n := count(); n != 0 {
				t.Errorf("%d payment rows, want none", n)
			}
		})
	}
}

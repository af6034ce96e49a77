package idemclient_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/problem"
)

// gzipped is b compressed with gzip.
func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// writeGzipProblem answers a problem document compressed with gzip,
// whatever the request accepts (a proxy or a server that compresses its
// errors).
func writeGzipProblem(t *testing.T, w http.ResponseWriter, status int, typ, retryAfter string) {
	t.Helper()
	doc, err := problem.Problem{Type: typ, Title: "t", Status: status, Detail: "d"}.MarshalJSON()
	if err != nil {
		t.Error(err)
		return
	}
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", problem.MediaType)
	w.Header().Set("Content-Encoding", "gzip")
	w.WriteHeader(status)
	_, _ = w.Write(gzipped(t, doc))
}

// gzipPost is a command whose caller asked for gzip itself: net/http then
// leaves the body compressed (it decompresses only what it asked for).
func gzipPost(t *testing.T, url string) *http.Request {
	req := post(t, url, "{}")
	req.Header.Set("Accept-Encoding", "gzip")
	return req
}

// A problem document sent with Content-Encoding gzip, which net/http does
// not decompress when the request asked for gzip itself, is read: a
// key-reused 409 is a *KeyReusedError with the server's detail (it was a
// plain 409 response, the problem unread), and a request-in-progress 409
// is retried (it was returned at once).
func TestGzipProblemRead(t *testing.T) {
	t.Parallel()
	t.Run("key-reused", func(t *testing.T) {
		t.Parallel()
		srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			writeGzipProblem(t, w, http.StatusConflict, problem.TypeKeyReused, "")
		})
		c, _ := newClient(t, nil)
		req, _ := idemclient.WithKey(gzipPost(t, srv.URL), "k-1")
		resp, err := c.Do(req)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("got a response %d, want a *KeyReusedError", resp.StatusCode)
		}
		var e *idemclient.KeyReusedError
		if !errors.As(err, &e) {
			t.Fatalf("err %v, want a *KeyReusedError", err)
		}
		if e.Problem.Type != problem.TypeKeyReused || e.Problem.Detail != "d" || !strings.Contains(err.Error(), ": d") {
			t.Errorf("KeyReusedError %+v (%v): want the server's problem details", e, err)
		}
		if n := len(rec.seen()); n != 1 {
			t.Errorf("%d attempts, want 1", n)
		}
	})
	t.Run("decompressed by net/http", func(t *testing.T) {
		t.Parallel()
		srv, _ := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			writeGzipProblem(t, w, http.StatusConflict, problem.TypeKeyReused, "")
		})
		c, _ := newClient(t, nil)
		// No Accept-Encoding of the caller's: net/http asks for gzip
		// and decompresses; Do must not decompress again.
		var e *idemclient.KeyReusedError
		if _, err := c.Do(post(t, srv.URL, "{}")); !errors.As(err, &e) || e.Problem.Detail != "d" {
			t.Fatalf("err %v, want a *KeyReusedError with the server's detail", err)
		}
	})
	t.Run("request-in-progress", func(t *testing.T) {
		t.Parallel()
		srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				writeGzipProblem(t, w, http.StatusConflict, problem.TypeRequestInProgress, "1")
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
		var info idemclient.Retry
		c, _ := newClient(t, &idemclient.Config{OnRetry: func(r idemclient.Retry) { info = r }})
		resp, err := c.Do(gzipPost(t, srv.URL))
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || len(rec.seen()) != 2 || info.ProblemType != problem.TypeRequestInProgress {
			t.Errorf("status %d after %d attempts, retried after %q; want 201 after retrying the 409 request-in-progress",
				resp.StatusCode, len(rec.seen()), info.ProblemType)
		}
	})
}

// A response Do returns keeps its body as sent: still compressed, read
// from the start, for the caller who asked for gzip.
func TestGzipProblemBodyKept(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		writeGzipProblem(t, w, http.StatusConflict, problem.TypeURI("out-of-stock"), "")
	})
	c, _ := newClient(t, nil)
	resp, err := c.Do(gzipPost(t, srv.URL))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	defer resp.Body.Close()
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatalf("the body is not gzip any more: %v", err)
	}
	var p problem.Problem
	b, err := io.ReadAll(zr)
	if err != nil || p.UnmarshalJSON(b) != nil || p.Type != problem.TypeURI("out-of-stock") || p.Detail != "d" {
		t.Errorf("body %q (%v), want the problem as sent", b, err)
	}
}

// countingBody counts what is read of a response's body as sent.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if resp != nil {
		resp.Body = countingBody{resp.Body, &c.n}
	}
	return resp, err
}

// A gzip bomb does not make Do read, or allocate, more than its 64 KiB
// limit: of the document once decompressed (a GiB of it here, from about
// a MiB sent), and of the body as sent (a stream of empty gzip members,
// which decompresses to nothing however long it is). The 500 whose type
// lies beyond the limit is one whose type cannot be read: returned, not
// retried.
func TestGzipProblemBomb(t *testing.T) {
	t.Parallel()
	// 1 MiB of the detail's letters, and an empty member of 32 bytes, so
	// that 64 KiB of them end at a member's end, as a whole stream would.
	mib := gzipped(t, bytes.Repeat([]byte("a"), 1<<20))
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Extra = make([]byte, 7)
	if err := zw.Close(); err != nil || buf.Len() != 32 {
		t.Fatalf("empty member of %d bytes (%v), want 32", buf.Len(), err)
	}
	empty := buf.Bytes()
	for _, tt := range []struct {
		name string
		body func(w io.Writer) error
	}{
		{"a GiB decompressed", func(w io.Writer) error {
			if _, err := w.Write(gzipped(t, []byte(`{"detail":"`))); err != nil {
				return err
			}
			for range 1 << 10 {
				if _, err := w.Write(mib); err != nil {
					return err
				}
			}
			_, err := w.Write(gzipped(t, []byte(`","type":"`+problem.TypeStoreUnavailable+`"}`)))
			return err
		}},
		{"empty members", func(w io.Writer) error {
			for range 1 << 16 {
				if _, err := w.Write(empty); err != nil {
					return err
				}
			}
			return nil
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", problem.MediaType)
				w.Header().Set("Content-Encoding", "gzip")
				w.WriteHeader(http.StatusInternalServerError)
				_ = tt.body(w) // the client closes the connection long before the end
			})
			ct := &countingTransport{next: &http.Transport{DisableCompression: true, DisableKeepAlives: true}}
			c, _ := newClient(t, &idemclient.Config{HTTPClient: &http.Client{Transport: ct, Timeout: 10 * time.Second}})
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			defer resp.Body.Close()
			if n := ct.n.Load(); n > 80<<10 {
				t.Errorf("Do read %d bytes of the body as sent; want at most its 64 KiB limit (and a buffer)", n)
			}
			if resp.StatusCode != http.StatusInternalServerError || len(rec.seen()) != 1 {
				t.Errorf("status %d after %d attempts; want the 500 whose type cannot be read, not retried", resp.StatusCode, len(rec.seen()))
			}
			// The body still reads from the start, as sent.
			zr, err := gzip.NewReader(resp.Body)
			if err != nil {
				t.Fatalf("the body is not gzip any more: %v", err)
			}
			head := make([]byte, 11)
			if _, err := io.ReadFull(zr, head); tt.name == "a GiB decompressed" && (err != nil || string(head) != `{"detail":"`) {
				t.Errorf("body starts with %q (%v)", head, err)
			}
		})
	}
}

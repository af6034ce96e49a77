package idemclient

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"7", 7 * time.Second, true},
		{" 7 ", 7 * time.Second, true},
		{"0", 0, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},        // in the past: nothing to wait for (delay backs off)
		{"Wednesday, 02-Dec-26 10:00:30 GMT", 30 * time.Second, true}, // RFC 850
		{"Wed Dec  2 10:00:45 2026", 45 * time.Second, true},          // asctime
	}
	for _, tt := range tests {
		resp := &http.Response{Header: http.Header{}}
		if tt.v != "" {
			resp.Header.Set("Retry-After", tt.v)
		}
		got, ok := retryAfter(resp, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("retryAfter(%q) = %s, %v; want %s, %v", tt.v, got, ok, tt.want, tt.ok)
		}
	}
	// An HTTP-date against the response's Date: the server's clock.
	for _, date := range []time.Time{now.Add(-time.Hour), now.Add(time.Hour)} {
		resp := &http.Response{Header: http.Header{}}
		resp.Header.Set("Date", date.Format(http.TimeFormat))
		resp.Header.Set("Retry-After", date.Add(20*time.Second).Format(http.TimeFormat))
		if got, ok := retryAfter(resp, now); got != 20*time.Second || !ok {
			t.Errorf("Date %s: retryAfter = %s, %v; want 20s, true", date, got, ok)
		}
		resp.Header.Set("Retry-After", "7")
		if got, ok := retryAfter(resp, now); got != 7*time.Second || !ok {
			t.Errorf("Date %s: retryAfter(7) = %s, %v; want 7s, true", date, got, ok)
		}
	}
	if _, ok := retryAfter(nil, now); ok {
		t.Error("retryAfter(nil) ok")
	}
}

func TestJitter(t *testing.T) {
	t.Parallel()
	base, ceil := 100*time.Millisecond, 10*time.Second
	for n := 1; n <= 40; n++ {
		want := min(base<<min(n-1, 20), ceil)
		var top time.Duration
		for range 200 {
			d := jitter(base, ceil, n)
			if d < 0 || d > want {
				t.Fatalf("jitter(n=%d) = %s, want within [0, %s]", n, d, want)
			}
			top = max(top, d)
		}
		if top < want/2 { // 200 uniform draws all in the lower half: (1/2)^200
			t.Errorf("jitter(n=%d) never above %s: not full jitter", n, top)
		}
	}
	// A MaxDelay meant as "no cap": doubling must not overflow to a
	// negative ceiling (no wait at all).
	for n := 30; n <= 80; n += 10 {
		if d := jitter(base, math.MaxInt64, n); d < 0 || (n >= 40 && d == 0 && jitter(base, math.MaxInt64, n) == 0) {
			t.Fatalf("jitter(n=%d) with MaxDelay MaxInt64 = %s; want a positive wait", n, d)
		}
	}
	if d := jitter(0, 0, 3); d != 0 {
		t.Errorf("jitter with zero base = %s", d)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The jitter added to a Retry-After, with the random draw known: at most
// a tenth of the wait and RetryAfterJitter, never making the wait pass
// MaxRetryAfter, the deadline or MaxElapsed (Do would give up on a wait it
// could make), never below the server's.
func TestRetryAfterJitterBounds(t *testing.T) {
	t.Parallel()
	top := func(n int64) int64 { return n - 1 } // the largest draw
	for _, tt := range []struct {
		name     string
		ra       string
		cfg      Config
		deadline time.Duration // of the context, from the start of Do; 0: none
		draw     func(int64) int64
		min, max time.Duration // of the wait
	}{
		{"a tenth", "2", Config{}, 0, top, 2200 * time.Millisecond, 2200 * time.Millisecond},
		{"smallest draw: the server's wait", "2", Config{}, 0, func(int64) int64 { return 0 }, 2 * time.Second, 2 * time.Second},
		{"a tenth of 30s", "30", Config{MaxRetryAfter: 10 * time.Minute}, 0, top, 33 * time.Second, 33 * time.Second},
		{"at most DefaultRetryAfterJitter", "100", Config{MaxRetryAfter: 10 * time.Minute}, 0, top, 105 * time.Second, 105 * time.Second},
		{"at most RetryAfterJitter", "30", Config{RetryAfterJitter: time.Second}, 0, top, 31 * time.Second, 31 * time.Second},
		{"NoRetryAfterJitter", "30", Config{RetryAfterJitter: NoRetryAfterJitter}, 0, func(int64) int64 { panic("drawn") }, 30 * time.Second, 30 * time.Second},
		{"within MaxRetryAfter", "57", Config{}, 0, top, time.Minute, time.Minute},
		{"at MaxRetryAfter: none", "60", Config{}, 0, top, time.Minute, time.Minute},
		{"within MaxElapsed", "2", Config{MaxElapsed: 2050 * time.Millisecond}, 0, top, 2 * time.Second, 2050 * time.Millisecond},
		{"before the deadline", "2", Config{}, 2100 * time.Millisecond, top, 2 * time.Second, 2100 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var n int
			cfg := tt.cfg
			cfg.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				n++
				resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r}
				if n == 1 {
					resp.StatusCode = http.StatusServiceUnavailable
					resp.Header.Set("Retry-After", tt.ra)
				}
				return resp, nil
			})}
			var waits []time.Duration
			cfg.Sleep = func(ctx context.Context, d time.Duration) error {
				waits = append(waits, d)
				return ctx.Err()
			}
			c, err := New(&cfg)
			if err != nil {
				t.Fatal(err)
			}
			c.int64N = tt.draw
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://idem.test/", strings.NewReader("{}"))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("Do: %v; want a retry after the server's wait", err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK || len(waits) != 1 || waits[0] < tt.min || waits[0] > tt.max {
				t.Errorf("status %d, waits %v; want 200 after one wait in [%s, %s]", resp.StatusCode, waits, tt.min, tt.max)
			}
		})
	}
}

// repeatReader reads b n times over, made as it is read.
type repeatReader struct {
	b    []byte
	n    int
	off  int
	read int64
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	k := copy(p, r.b[r.off:])
	if r.off += k; r.off == len(r.b) {
		r.off, r.n = 0, r.n-1
	}
	r.read += int64(k)
	return k, nil
}

// peekBody holds at most peekLimit bytes of a gzip body's document, and
// reads at most peekLimit bytes of it as sent, however much it
// decompresses to (a bomb: 64 GiB from about 64 MiB) or however little (a
// stream of empty members).
func TestPeekGzipBounded(t *testing.T) {
	t.Parallel()
	member := func(b []byte) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(b)
		_ = zw.Close()
		return buf.Bytes()
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Extra = make([]byte, 7) // an empty member of 32 bytes: 2048 in peekLimit
	_ = zw.Close()
	member32 := buf.Bytes()
	for _, tt := range []struct {
		name string
		body *repeatReader
		want int // bytes of document peeked
	}{
		{"bomb", &repeatReader{b: member(bytes.Repeat([]byte(" "), 1<<20)), n: 1 << 16}, peekLimit},
		{"empty members", &repeatReader{b: member(nil), n: 1 << 20}, 0},
		{"empty members ending at the limit", &repeatReader{b: member32, n: 1 << 20}, 0},
	} {
		resp := &http.Response{Header: http.Header{}, Body: io.NopCloser(tt.body)}
		resp.Header.Set("Content-Type", "application/problem+json")
		resp.Header.Set("Content-Encoding", "gzip")
		b, ok, err := peekBody(resp)
		if !ok || len(b) != tt.want || tt.body.read > peekLimit {
			t.Errorf("%s: peeked %d bytes of document (ok %v) from %d sent; want %d from at most %d", tt.name, len(b), ok, tt.body.read, tt.want, peekLimit)
		}
		if len(b) == 0 && err == nil {
			t.Errorf("%s: no document and no error: read as an empty body, not one cut off", tt.name)
		}
	}
}

package idemclient

import (
	"math"
	"net/http"
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

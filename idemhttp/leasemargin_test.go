package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/idemhttp"
)

// While the owner runs, its lease in the database never comes near expiry
// (renewals every Lease/3 keep it at least 2/3 Lease ahead): a duplicate
// arriving at any moment finds it alive and does not take over.
func TestLeaseMarginWhileOwnerAlive(t *testing.T) {
	t.Parallel()
	e := sqliteEnv(t)
	var calls atomic.Int64
	release := make(chan struct{})
	running := make(chan struct{})
	// A 3s lease, looked at for 3.5s: renewed every second, it stays 2s
	// ahead, and a loaded machine's stall of over a second does not bring
	// it within 700ms of its end; without renewals it would end.
	h := e.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: 3 * time.Second, Wait: idemhttp.NoWait},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			close(running)
			<-release
			w.WriteHeader(201)
		}))
	done := make(chan struct{})
	var first *httptest.ResponseRecorder
	go func() { first = send(h, "POST", "/pay", "k", `{}`); close(done) }()
	select {
	case <-running:
	case <-done:
		// Answered without running the handler (the claim failed): say
		// so instead of waiting for the handler for ever.
		t.Fatalf("the request was answered %d %s without running the handler", first.Code, first.Body.String())
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start within 30 s")
	}
	least := time.Hour
	for end := time.Now().Add(3500 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		rec, err := e.executor.RecordGet(t.Context(), &driver.RecordGetParams{Scope: "anonymous POST /pay", Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if m := time.Until(rec.LeaseExpiresAt); m < least {
			least = m
		}
	}
	close(release)
	<-done
	if least < 700*time.Millisecond {
		t.Fatalf("the lease came within %s of expiring while its owner was alive; want at least 700ms (renewed every Lease/3)", least)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times; want 1", n)
	}
}

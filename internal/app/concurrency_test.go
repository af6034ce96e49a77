package app_test

import (
	"bytes"
	"net/http"
	"sync"
	"testing"

	"github.com/idemkit/idem/problem"
)

// 50 identical requests at once (a client retrying aggressively): one
// payment, and every answer is the same 201, or a 409 request-in-progress
// with Retry-After for a duplicate that waited longer than idemhttp's Wait.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		const n = 50
		var (
			wg        sync.WaitGroup
			responses = make([]response, n)
			start     = make(chan struct{})
		)
		for i := range n {
			wg.Go(func() {
				<-start
				responses[i] = e.post("burst", paymentBody("ext-burst"))
			})
		}
		close(start)
		wg.Wait()

		var created []byte
		executed, inProgress := 0, 0
		for _, r := range responses {
			switch {
			case r.status == http.StatusCreated:
				if created == nil {
					created = r.body
				}
				if !bytes.Equal(r.body, created) {
					t.Errorf("different 201 bodies:\n%s\n%s", r.body, created)
				}
				if r.header.Get("Idempotent-Replayed") == "" {
					executed++
				}
			case r.status == http.StatusConflict && r.problemType(t) == problem.TypeRequestInProgress && r.header.Get("Retry-After") != "":
				inProgress++
			default:
				t.Errorf("unexpected answer %d %s", r.status, r.body)
			}
		}
		if executed != 1 {
			t.Errorf("%d requests executed, want exactly 1", executed)
		}
		if inProgress > 0 {
			t.Logf("%d of %d duplicates answered 409 request-in-progress", inProgress, n)
		}
		if got := e.count(); got != 1 {
			t.Errorf("%d payment rows, want exactly 1", got)
		}
	})
}

// The same payment under 20 different keys at once: one row, one 201, and
// 200 with the same payment for every other key.
func TestConcurrentKeysSamePayment(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		const n = 20
		var (
			wg        sync.WaitGroup
			responses = make([]response, n)
			start     = make(chan struct{})
		)
		for i := range n {
			wg.Go(func() {
				<-start
				responses[i] = e.post("key-"+string(rune('A'+i)), paymentBody("ext-same"))
			})
		}
		close(start)
		wg.Wait()
		statuses := map[int]int{}
		for _, r := range responses {
			statuses[r.status]++
			if r.status < 300 && !bytes.Equal(r.body, responses[0].body) {
				t.Errorf("body %s differs from %s", r.body, responses[0].body)
			}
		}
		if statuses[http.StatusCreated] != 1 || statuses[http.StatusOK] != n-1 {
			t.Errorf("statuses %v, want one 201 and %d 200", statuses, n-1)
		}
		if got := e.count(); got != 1 {
			t.Errorf("%d payment rows, want exactly 1", got)
		}
	})
}

package idemclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"
)

// A body Do must buffer (no GetBody) that stalls, as the body of an
// incoming request a gateway forwards when its client stops sending, is
// read within the request's context: Do returns when the context ends, as
// http.Client.Do would, instead of waiting for the body for ever.
func TestBodyReadStopsWithContext(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	c, _ := newClient(t, nil)
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.CloseWithError(errors.New("test over")) })
	go func() { _, _ = pw.Write([]byte(`{"amount":`)) }() // then nothing more
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, pr)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := c.Do(req)
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		if r.resp != nil {
			r.resp.Body.Close()
			t.Fatalf("response %d; want the context's error", r.resp.StatusCode)
		}
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("Do: %v; want context.DeadlineExceeded", r.err)
		}
	case <-time.After(20 * time.Second):
		_ = pw.CloseWithError(errors.New("test over"))
		t.Fatal("Do still reading the body 20s after its context ended")
	}
	if n := len(rec.seen()); n != 0 {
		t.Errorf("%d requests reached the server; want none", n)
	}
}

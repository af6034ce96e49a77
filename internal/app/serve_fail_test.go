package app_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
)

// When the HTTP server fails (its listener closes) while ctx is still
// live, Serve returns the error at once, having stopped the workers and the
// retention sweep: it must not wait for a signal that may never come.
func TestServeReturnsWhenServerFails(t *testing.T) {
	t.Parallel()
	cfg, err := app.ParseConfig([]string{"-db", "sqlite:" + testdb.SQLitePath(t)}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(context.Background(), cfg, newTestLogger(io.Discard))
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	defer a.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	time.Sleep(200 * time.Millisecond)
	_ = ln.Close() // the server fails
	select {
	case err := <-done:
		if err == nil {
			t.Error("Serve returned nil after its listener failed")
		}
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("Serve did not return within 10s after its server failed")
	}
}

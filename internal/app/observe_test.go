package app

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testlog"
)

// A handler that panics is logged and counted. Before its response
// started, the client gets a 500 problem; after, its connection is cut
// (as net/http does), so that a truncated body never reaches the client
// as a complete response.
func TestHandlerPanic(t *testing.T) {
	t.Parallel()
	logs := &testlog.Buffer{}
	a := &App{log: slog.New(slog.NewJSONHandler(logs, nil)), metrics: newMetrics()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /early", func(http.ResponseWriter, *http.Request) { panic("early") })
	mux.HandleFunc("GET /late", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"items":[1,2,`)
		panic("late")
	})
	srv := httptest.NewServer(a.observe(mux))
	srv.Config.ErrorLog = slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)
	t.Cleanup(srv.Close)

	res, err := srv.Client().Get(srv.URL + "/early")
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusInternalServerError || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("panic before the response: %d %s, want a 500 problem", res.StatusCode, res.Header.Get("Content-Type"))
	}

	res, err = srv.Client().Get(srv.URL + "/late")
	if err == nil {
		body, rerr := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if rerr == nil {
			t.Errorf("panic in the middle of the response: the client got %d %q as a complete response; want the connection cut", res.StatusCode, body)
		}
	} else if !errors.Is(err, io.ErrUnexpectedEOF) && !strings.Contains(err.Error(), "EOF") {
		t.Logf("client error: %v", err)
	}
	if n := strings.Count(logs.String(), `"msg":"handler panic"`); n != 2 {
		t.Errorf("%d handler panic lines, want 2:\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), `"msg":"request"`); n != 2 {
		t.Errorf("%d access log lines, want 2:\n%s", n, logs)
	}
}

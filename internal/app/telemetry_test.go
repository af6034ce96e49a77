package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testlog"
)

func TestOTelSetting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		env  map[string]string
		want bool
	}{
		{nil, nil, false},
		{[]string{"-otel"}, nil, true},
		{nil, map[string]string{app.EnvOTel: "true"}, true},
		{nil, map[string]string{app.EnvOTLPEndpoint: "http://collector:4318"}, true},
		{nil, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{[]string{"-otel=false"}, map[string]string{app.EnvOTLPEndpoint: "http://collector:4318"}, false},
		{nil, map[string]string{app.EnvOTel: "0", app.EnvOTLPEndpoint: "http://collector:4318"}, false},
	} {
		cfg, err := app.ParseConfig(c.args, func(k string) string { return c.env[k] })
		if err != nil || cfg.OTel != c.want {
			t.Errorf("ParseConfig(%v, %v): OTel %v, %v; want %v", c.args, c.env, cfg.OTel, err, c.want)
		}
	}
	if _, err := app.ParseConfig(nil, func(k string) string { return map[string]string{app.EnvOTel: "maybe"}[k] }); err == nil {
		t.Error("IDEMD_OTEL=maybe accepted")
	}
	if !strings.Contains(app.Usage(), "-otel") {
		t.Error("Usage lacks -otel")
	}
	// idemd -h names both variables that turn -otel on, as ParseConfig
	// reads them.
	for _, v := range []string{app.EnvOTLPEndpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if !strings.Contains(app.Usage(), v) {
			t.Errorf("Usage does not say that %s turns -otel on", v)
		}
	}
}

// -otel with a program that plugs in no exporter: idemd says so and goes
// on.
func TestOTelWithoutExporter(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // start no further than the telemetry
	app.RunWith(ctx, []string{"-otel", "-addr", "127.0.0.1:0", "-db", "sqlite:" + t.TempDir() + "/d.db", "-kafka", "off", "-cleanup", "off"},
		func(string) string { return "" }, &stdout, &stderr, app.Options{})
	if !strings.Contains(stderr.String(), "no OpenTelemetry exporter") {
		t.Errorf("stderr %s", stderr.String())
	}
}

// The exporters' last flush counts in -shutdown-timeout: with a collector
// that never answers, idemd exits within the bound, not 5 s after it.
func TestTelemetryFlushWithinShutdownTimeout(t *testing.T) {
	t.Parallel()
	var stdout, stderr testlog.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	flushed := make(chan time.Duration, 1)
	opts := app.Options{Telemetry: func(context.Context, app.TelemetrySetup) (*app.Telemetry, error) {
		return &app.Telemetry{Shutdown: func(ctx context.Context) error {
			start := time.Now()
			deadline, ok := ctx.Deadline()
			<-ctx.Done() // a collector that never answers
			if !ok {
				flushed <- time.Hour // no bound at all
			} else {
				flushed <- deadline.Sub(start) // the time the flush was given
			}
			return ctx.Err()
		}}, nil
	}}
	done := make(chan int, 1)
	go func() {
		done <- app.RunWith(ctx, []string{"-otel", "-addr", "127.0.0.1:0", "-db", "sqlite:" + t.TempDir() + "/d.db",
			"-kafka", "off", "-cleanup", "off", "-shutdown-timeout", "1s"},
			func(string) string { return "" }, &stdout, &stderr, opts)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stdout.String(), "listening") {
		if time.Now().After(deadline) {
			t.Fatalf("idemd did not start: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	m := stallmeter.Start(t)
	cancel()
	var stalled time.Duration
	select {
	case code := <-done:
		var took time.Duration
		if took, stalled = m.Elapsed(); took > 2*time.Second {
			t.Errorf("idemd exited %s after the stop (and the process stalled %s) with -shutdown-timeout 1s; want within it", took, stalled)
		}
		if code != 0 {
			t.Errorf("exit code %d; stderr: %s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("idemd did not exit")
	}
	select {
	case d := <-flushed:
		// The flush's deadline: at most what is left of 1s (read from
		// its context, not timed: a process stalled for seconds on a
		// loaded machine does not change it); a flush given its own 5s
		// (telemetryShutdownTimeout) fails.
		if d > time.Second {
			t.Errorf("the flush was given %s; want at most what is left of 1s", d)
		}
	default:
		// A process that stood still for most of the 1s spent it before
		// the flush: skipping the flush is then what -shutdown-timeout
		// asks for.
		if stalled < 500*time.Millisecond || !strings.Contains(stderr.String(), "last flush skipped: -shutdown-timeout is spent") {
			t.Errorf("the exporters were never flushed (the process stalled %s); stderr: %s", stalled, stderr.String())
		} else {
			t.Logf("the process stalled %s of the 1s -shutdown-timeout: the flush was skipped", stalled)
		}
	}
}

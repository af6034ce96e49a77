package app_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/app"
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

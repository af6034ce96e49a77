package app_test

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/internal/app"
)

// runEnv calls app.RunWith with the environment environ ("NAME=value").
func runEnv(t *testing.T, args []string, environ ...string) (code int, stdout, stderr string) {
	t.Helper()
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	var out, errOut bytes.Buffer
	code = app.RunWith(context.Background(), args, envOf(env), &out, &errOut,
		app.Options{Environ: func() []string { return environ }})
	return code, out.String(), errOut.String()
}

// TestEveryVariableReadIsKnown: each IDEMD_ variable that idemd or one of
// its subcommands reads is accepted in the environment, so that refusing
// the unknown ones never refuses a real one.
func TestEveryVariableReadIsKnown(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	read := map[string]bool{}
	getenv := func(name string) string {
		mu.Lock()
		defer mu.Unlock()
		if strings.HasPrefix(name, "IDEMD_") {
			read[name] = true
		}
		return ""
	}
	// Each stops on a configuration mistake found after reading all of
	// its command's variables.
	for _, args := range [][]string{
		{"-kafka", "off", "-saga-stuck-after", "1h", "-saga-give-up-after", "1m"},
		{"-kafka", "b-1:9092", "-kafka-sasl", "plain", "-kafka-sasl-user", "u"},
		{"demo", "-orders", "0"},
		{"migrate", "sql", "-db", "mysql://x"},
		{"outbox", "redrive", "-all", "-db", "mysql://x"},
		{"outbox", "unpark", "-all", "-db", "mysql://x"},
	} {
		var out, errOut bytes.Buffer
		if code := app.RunWith(context.Background(), args, getenv, &out, &errOut, app.Options{}); code != 2 {
			t.Fatalf("%v: exit %d, want 2 (a configuration mistake); stderr %s", args, code, errOut.String())
		}
	}
	for _, name := range []string{"IDEMD_DB", "IDEMD_OTEL", "IDEMD_KAFKA_SASL_PASSWORD", "IDEMD_SAGA_GIVE_UP_AFTER"} {
		if !read[name] {
			t.Fatalf("%s was not read: the runs above no longer reach every getenv", name)
		}
	}
	environ := []string{"IDEMD_DB=sqlite:" + filepath.Join(t.TempDir(), "d.db")}
	for name := range read {
		if name != "IDEMD_DB" {
			environ = append(environ, name+"=x")
		}
	}
	slices.Sort(environ)
	if code, _, stderr := runEnv(t, []string{"migrate", "sql"}, environ...); code != 0 {
		t.Errorf("with %v: exit %d, stderr %s", environ, code, stderr)
	}
}

func TestUnknownVariable(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "d.db")
	for _, tt := range []struct {
		environ []string
		want    string // stderr; "" when accepted
	}{
		{[]string{"IDEMD_DB=" + db, "HOME=/root", "IDEMDX=1", "MY_IDEMD_DB=x"}, ""},
		{[]string{"IDEMD_DB=" + db, "IDEMD_KAFKA_TLS_CRT=/etc/c.pem"}, "unknown environment variable IDEMD_KAFKA_TLS_CRT (did you mean IDEMD_KAFKA_TLS_CERT?)"},
		{[]string{"IDEMD_DB=" + db, "IDEMD_SHUTDOWN_TIEMOUT=30s"}, "unknown environment variable IDEMD_SHUTDOWN_TIEMOUT (did you mean IDEMD_SHUTDOWN_TIMEOUT?)"},
		{[]string{"IDEMD_DB=" + db, "IDEMD_DATABASE_URL=postgres://db/pay"}, "unknown environment variable IDEMD_DATABASE_URL (did you mean IDEMD_DB?)"},
		{[]string{"IDEMD_DB=" + db, "Idemd_Kafka=off"}, "unknown environment variable Idemd_Kafka (did you mean IDEMD_KAFKA?)"},
		{[]string{"IDEMD_DB=" + db, "IDEMD_METRICS_ADDR=:9090"}, "unknown environment variable IDEMD_METRICS_ADDR (did you mean IDEMD_ADMIN_ADDR?)"},
		// Set but empty is still a typo of a name.
		{[]string{"IDEMD_DB=" + db, "IDEMD_FOO="}, "unknown environment variable IDEMD_FOO (idemd -h lists the variables idemd reads)"},
		{[]string{"IDEMD_DB=" + db, "IDEMD_FOO=1", "IDEMD_FOO=2"}, "unknown environment variable IDEMD_FOO (idemd -h lists the variables idemd reads)"},
	} {
		code, _, stderr := runEnv(t, []string{"migrate", "sql"}, tt.environ...)
		if tt.want == "" {
			if code != 0 {
				t.Errorf("%v: exit %d, stderr %s; want it accepted", tt.environ, code, stderr)
			}
			continue
		}
		if want := "idemd migrate sql: " + tt.want + "\n"; code != 2 || stderr != want {
			t.Errorf("%v: exit %d, stderr %q; want exit 2, %q", tt.environ, code, stderr, want)
		}
	}
	// The check comes before the other configuration mistakes, which a
	// typo may cause.
	code, _, stderr := runEnv(t, []string{"-kafka", "off"}, "IDEMD_KAFKA_SASL_USR=idemd", "IDEMD_KAFKA_SASL=plain")
	if want := "idemd: unknown environment variable IDEMD_KAFKA_SASL_USR (did you mean IDEMD_KAFKA_SASL_USER?)\n"; code != 2 || stderr != want {
		t.Errorf("exit %d, stderr %q; want exit 2, %q", code, stderr, want)
	}
}

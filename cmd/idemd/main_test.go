package main_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinary builds idemd and runs it as a user would.
func TestBinary(t *testing.T) {
	t.Parallel()
	bin := idemdBinary(t) // built once for every test (e2e_helpers_test.go)
	t.Run("serves and exits 0 on SIGTERM", func(t *testing.T) {
		t.Parallel()
		testServe(t, bin, syscall.SIGTERM)
	})
	t.Run("serves and exits 0 on SIGINT", func(t *testing.T) {
		t.Parallel()
		testServe(t, bin, syscall.SIGINT)
	})
	t.Run("admin listener: probes and metrics, SIGTERM closes both", func(t *testing.T) {
		t.Parallel()
		testAdmin(t, bin)
	})
	for name, args := range map[string][]string{
		"bad flag":             {"-bogus"},
		"bad addr":             {"-addr", "localhost"},
		"unknown scheme":       {"-db", "mysql://root@db/pay"},
		"topic with kafka off": {"-kafka", "off", "-kafka-topic", "shop.orders"},
		"admin addr is addr":   {"-addr", "127.0.0.1:8080", "-admin-addr", "127.0.0.1:8080"},
	} {
		t.Run(name+" exits 2 with one line", func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(bin, args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("%v: %v, want exit code 2", args, err)
			}
			if lines := strings.Count(stderr.String(), "\n"); lines != 1 || !strings.HasPrefix(stderr.String(), "idemd: ") {
				t.Errorf("stderr %q, want one line", stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
		})
	}
}

var listenRe = regexp.MustCompile(`^idemd listening on (http://127\.0\.0\.1:\d+) with database sqlite:(\S+) and kafka embedded \(127\.0\.0\.1:\d+, log [^)]+\)$`)

func testServe(t *testing.T, bin string, sig syscall.Signal) {
	dbPath := filepath.Join(t.TempDir(), "pay.db")
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-db", "sqlite:"+dbPath)
	lines, exited, stderr := startBinary(t, cmd)
	var base string
	select {
	case line := <-lines:
		m := listenRe.FindStringSubmatch(line)
		if m == nil || m[2] != dbPath {
			t.Fatalf("first line %q, want the listen line; stderr %s", line, stderr.String())
		}
		base = m[1]
	case <-time.After(20 * time.Second):
		t.Fatal("no listen line within 20s")
	}

	post := func(key string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/payments",
			strings.NewReader(`{"provider":"sber","external_payment_id":"ext-1","amount":"100.50","customer_id":42}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		return do(t, req)
	}
	res, created := post("k1")
	if res.StatusCode != http.StatusCreated || !strings.Contains(created, `"amount":"100.5000"`) {
		t.Fatalf("POST: %d %s", res.StatusCode, created)
	}
	res, replay := post("k1")
	if res.StatusCode != http.StatusCreated || replay != created || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d %s", res.StatusCode, replay)
	}
	loc, _ := http.NewRequest(http.MethodGet, base+res.Header.Get("Location"), nil)
	if res, got := do(t, loc); res.StatusCode != http.StatusOK || got != created {
		t.Errorf("GET %s: %d %s", loc.URL, res.StatusCode, got)
	}

	// The order pipeline on the embedded defaults: order, outbox, relay,
	// in-process Kafka, consumer, projection.
	order, _ := http.NewRequest(http.MethodPost, base+"/v1/orders",
		strings.NewReader(`{"customer_id":42,"amount":"19.90","items":[{"sku":"A-1","quantity":2}]}`))
	order.Header.Set("Content-Type", "application/json")
	order.Header.Set("Idempotency-Key", "order-1")
	if res, body := do(t, order); res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/orders: %d %s", res.StatusCode, body)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/customers/42/summary", nil)
		res, body := do(t, req)
		if res.StatusCode == http.StatusOK && strings.Contains(body, `"orders":1,"pending":0,"confirmed":1,"rejected":0,"total_amount":"19.9000"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("summary: %d %s", res.StatusCode, body)
		}
	}

	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	waitExit(t, exited, stderr, sig)
	if !strings.Contains(stderr.String(), `"msg":"request"`) {
		t.Errorf("no access log on stderr: %s", stderr.String())
	}
}

var adminListenRe = regexp.MustCompile(`^idemd listening on (http://127\.0\.0\.1:\d+) with database sqlite:\S+ and kafka off; admin endpoints \(/metrics, /healthz, /livez\) on (http://127\.0\.0\.1:\d+)$`)

// testAdmin runs idemd with -admin-addr: the metrics on the admin port
// only, the probes on both, and a SIGTERM that frees both ports.
func testAdmin(t *testing.T, bin string) {
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-kafka", "off",
		"-db", "sqlite:"+filepath.Join(t.TempDir(), "pay.db"))
	lines, exited, stderr := startBinary(t, cmd)
	var base, admin string
	select {
	case line := <-lines:
		m := adminListenRe.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("first line %q, want the listen line with both addresses; stderr %s", line, stderr.String())
		}
		base, admin = m[1], m[2]
	case <-time.After(20 * time.Second):
		t.Fatal("no listen line within 20s")
	}
	for _, c := range []struct {
		url    string
		status int
		body   string
	}{
		{base + "/metrics", http.StatusNotFound, "There is no route for GET /metrics"},
		{base + "/healthz", http.StatusOK, `{"status":"ok"}`},
		{admin + "/healthz", http.StatusOK, `{"status":"ok"}`},
		{admin + "/livez", http.StatusOK, `{"status":"ok"}`},
		{admin + "/metrics", http.StatusOK, `process_start_time_seconds`},
	} {
		req, _ := http.NewRequest(http.MethodGet, c.url, nil)
		if res, body := do(t, req); res.StatusCode != c.status || !strings.Contains(body, c.body) {
			t.Errorf("GET %s: %d %q; want %d with %q", c.url, res.StatusCode, body, c.status, c.body)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit(t, exited, stderr, syscall.SIGTERM)
	for _, u := range []string{base, admin} {
		ln, err := net.Listen("tcp", strings.TrimPrefix(u, "http://"))
		if err != nil {
			t.Errorf("%s still held after idemd exited: %v", u, err)
			continue
		}
		_ = ln.Close()
	}
}

// startBinary starts cmd and returns its first line of stdout (the listen
// line), its exit (kept for the cleanup, which kills it), and its stderr.
func startBinary(t *testing.T, cmd *exec.Cmd) (<-chan string, chan error, *bytes.Buffer) {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSuffix(line, "\n")
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	return lines, exited, &stderr
}

// waitExit waits up to 20 s for the process started by startBinary to
// exit with code 0 after sig.
func waitExit(t *testing.T, exited chan error, stderr *bytes.Buffer, sig syscall.Signal) {
	t.Helper()
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		if err != nil {
			t.Errorf("after %v: %v, want exit code 0; stderr %s", sig, err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("still running 20s after %v", sig)
	}
}

func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

// TestUnknownEnvironmentVariable: an IDEMD_ variable idemd does not read (a
// typo) stops idemd and each of its subcommands before they do anything,
// with exit code 2 and one line naming it (never its value); -h still
// answers, and every variable -h lists is accepted.
func TestUnknownEnvironmentVariable(t *testing.T) {
	t.Parallel()
	bin := idemdBinary(t)
	// run runs idemd with the test's environment minus its IDEMD_
	// variables, plus env.
	run := func(t *testing.T, args []string, env ...string) (code int, stdout, stderr string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(strings.ToUpper(kv), "IDEMD_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, env...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		if ctx.Err() != nil {
			t.Fatalf("idemd %v with %v still running after 30s: it ignored the variable; stdout %s", args, env, out.String())
		}
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
	}
	db := "sqlite:" + filepath.Join(t.TempDir(), "pay.db")
	commands := []struct {
		prefix string
		args   []string
	}{
		{"idemd", []string{"-addr", "127.0.0.1:0", "-db", db, "-kafka", "off", "-cleanup", "off"}},
		{"idemd demo", []string{"demo", "-url", "http://127.0.0.1:1", "-reproduce=false", "-timeout", "5s"}},
		{"idemd migrate status", []string{"migrate", "status", "-db", db}},
		{"idemd migrate up", []string{"migrate", "up", "-db", db}},
		{"idemd outbox redrive", []string{"outbox", "redrive", "-all", "-db", db}},
		{"idemd outbox unpark", []string{"outbox", "unpark", "-all", "-db", db}},
	}
	for _, c := range commands {
		for _, tt := range []struct {
			env  []string
			want string
		}{
			{[]string{"IDEMD_DATABSE_URL=postgres://idemd:s3cret@db/pay"}, "unknown environment variable IDEMD_DATABSE_URL (did you mean IDEMD_DB?)"},
			{[]string{"IDEMD_KAFKA_SASL_PASWORD=s3cret"}, "unknown environment variable IDEMD_KAFKA_SASL_PASWORD (did you mean IDEMD_KAFKA_SASL_PASSWORD?)"},
			{[]string{"idemd_db=" + db}, "unknown environment variable idemd_db (did you mean IDEMD_DB?)"},
			{[]string{"IDEMD_DB=" + db, "IDEMD_WORKERS=4", "IDEMD_TOPIC=orders"},
				"unknown environment variables IDEMD_TOPIC (did you mean IDEMD_KAFKA_TOPIC?), IDEMD_WORKERS (idemd -h lists the variables idemd reads)"},
		} {
			t.Run(strings.Join(c.args[:min(2, len(c.args))], " ")+" "+tt.env[len(tt.env)-1], func(t *testing.T) {
				t.Parallel()
				code, stdout, stderr := run(t, c.args, tt.env...)
				if want := c.prefix + ": " + tt.want + "\n"; code != 2 || stderr != want {
					t.Errorf("exit %d, stderr %q; want exit 2, stderr %q", code, stderr, want)
				}
				if stdout != "" {
					t.Errorf("stdout %q, want nothing", stdout)
				}
			})
		}
	}

	t.Run("-h answers", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"-h"}, {"demo", "-h"}, {"migrate", "-h"}, {"migrate", "up", "-h"}, {"outbox", "redrive", "-h"}, {"outbox", "unpark", "-h"}} {
			code, stdout, stderr := run(t, args, "IDEMD_DATABSE_URL=postgres://db/pay")
			if code != 0 || !strings.HasPrefix(stdout, "usage: idemd") || stderr != "" {
				t.Errorf("idemd %v: exit %d, stdout %q, stderr %q; want exit 0 and the usage", args, code, stdout, stderr)
			}
		}
	})

	t.Run("every variable -h lists is known", func(t *testing.T) {
		t.Parallel()
		_, help, _ := run(t, []string{"-h"})
		names := regexp.MustCompile(`IDEMD_[A-Z_]+`).FindAllString(help, -1)
		if len(names) < 20 {
			t.Fatalf("idemd -h lists %d IDEMD_ variables: %s", len(names), help)
		}
		env := []string{"IDEMD_DB=" + db}
		for _, n := range names {
			if n != "IDEMD_DB" {
				env = append(env, n+"=x")
			}
		}
		code, stdout, stderr := run(t, []string{"migrate", "sql"}, env...)
		if code != 0 || !strings.Contains(stdout, "CREATE TABLE") {
			t.Errorf("idemd migrate sql with %v: exit %d, stderr %q", env, code, stderr)
		}
	})
}

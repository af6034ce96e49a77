package app_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// adminListenRe is the listen line with -admin-addr.
var adminListenRe = regexp.MustCompile(`^idemd listening on (http://\S+) with database (\S+) and kafka (embedded \(127\.0\.0\.1:\d+, log [^)]+\)|off|\S+); admin endpoints \(/metrics, /healthz, /livez\) on (http://\S+)\n$`)

// freshGet is a GET on a new connection (no keep-alive): whether the
// listener still accepts.
func freshGet(rawURL string) (int, string, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	res, err := c.Get(rawURL)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// startAdmin runs idemd with -admin-addr on the SQLite file path and
// returns its two base URLs, once it serves.
func startAdmin(t *testing.T, ctx context.Context, path string, extra ...string) (base, admin string, stdout, stderr *testlog.Buffer, exited chan int) {
	t.Helper()
	stdout, stderr = &testlog.Buffer{}, &testlog.Buffer{}
	exited = make(chan int, 1)
	args := append([]string{"-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-db", "sqlite:" + path, "-kafka", "off"}, extra...)
	go func() { exited <- app.Run(ctx, args, envOf(nil), stdout, stderr) }()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m := adminListenRe.FindStringSubmatch(stdout.String()); m != nil {
			return m[1], m[4], stdout, stderr, exited
		}
		select {
		case code := <-exited:
			t.Fatalf("Run returned %d before serving; stdout %q, stderr %s", code, stdout.String(), stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listen line naming both listeners; stdout %q, stderr %s", stdout.String(), stderr.String())
		}
	}
}

// With -admin-addr, Prometheus and the probes have a port of their own:
// /metrics is served there and no longer on -addr (which a public ingress
// routes), /healthz and /livez on both (load balancers probe the serving
// port), the API on -addr only. Before, idemd had one listener: /metrics
// answered on the API's port, to whatever reached it.
func TestRunAdminListener(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, admin, _, stderr, exited := startAdmin(t, ctx, testdb.SQLitePath(t))
	if base == admin {
		t.Fatalf("one URL for both listeners: %s", base)
	}

	req, _ := http.NewRequest(http.MethodPost, base+"/v1/payments", strings.NewReader(paymentBody("ext-admin-1")))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "admin-1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/payments on -addr: %d, want 201", res.StatusCode)
	}

	for _, c := range []struct {
		url    string
		status int
		body   string // a substring of the body
	}{
		{base + "/healthz", 200, `{"status":"ok"}`},
		{base + "/livez", 200, `{"status":"ok"}`},
		{base + "/metrics", 404, "There is no route for GET /metrics"},
		{admin + "/healthz", 200, `{"status":"ok"}`},
		{admin + "/livez", 200, `{"status":"ok"}`},
		{admin + "/metrics", 200, `idemd_http_requests_total{route="POST /v1/payments",status="201"} 1`},
		{admin + "/v1/payments/1", 404, "There is no route"},
		{admin + "/v1/kafka", 404, "There is no route"},
	} {
		status, body, err := freshGet(c.url)
		if err != nil || status != c.status || !strings.Contains(body, c.body) {
			t.Errorf("GET %s: %d %q, %v; want %d with %q", c.url, status, body, err, c.status, c.body)
		}
	}
	// Both listeners' requests are counted under the same routes: the
	// alerts on GET /healthz read them whichever port the probe uses.
	_, metrics, err := freshGet(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`idemd_http_requests_total{route="GET /healthz",status="200"} 2`,
		`idemd_http_requests_total{route="GET /metrics",status="200"} 1`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("admin /metrics lacks %s:\n%s", want, grepLines(metrics, "idemd_http_requests_total"))
		}
	}

	// The start-up line names both addresses.
	var started map[string]any
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, `"msg":"http server started"`) {
			if err := json.Unmarshal([]byte(line), &started); err != nil {
				t.Fatal(err)
			}
		}
	}
	if started["addr"] != strings.TrimPrefix(base, "http://") || started["admin_addr"] != strings.TrimPrefix(admin, "http://") {
		t.Errorf("http server started: %v; want addr %s and admin_addr %s", started, base, admin)
	}
	cancel()
	if code := <-exited; code != 0 {
		t.Errorf("exit code %d; stderr %s", code, stderr.String())
	}
}

// A SIGTERM closes both listeners at once, the first step of the
// shutdown: the probes of either port see the replica go away together
// (not the admin port still ready while the API's refuses), the request in
// flight on -addr finishes, and Run returns 0 with both ports free.
func TestRunAdminListenerShutdown(t *testing.T) {
	t.Parallel()
	path := testdb.SQLitePath(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, admin, _, stderr, exited := startAdmin(t, ctx, path)

	// Another process holds SQLite's write lock: the POST waits in BEGIN.
	other, err := sql.Open("sqlite", sqlitedriver.DSN(path, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lock, err := other.Begin()
	if err != nil {
		t.Fatal(err)
	}
	// The POST goes on a connection the server accepted already (a
	// request sent on a connection still in the listener's backlog would
	// be refused by the shutdown: the race of a loaded machine, not the
	// drain this test is about).
	client := &http.Client{Transport: &http.Transport{}}
	if res, err := client.Get(base + "/livez"); err != nil {
		t.Fatal(err)
	} else {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	done, wrote := make(chan int, 1), make(chan struct{})
	go func() {
		trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { close(wrote) }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
			http.MethodPost, base+"/v1/orders", strings.NewReader(orderBody(1, "5.00")))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "admin-drain")
		res, err := client.Do(req)
		if err != nil {
			t.Errorf("POST in flight: %v", err)
			done <- 0
			return
		}
		res.Body.Close()
		done <- res.StatusCode
	}()
	select {
	case <-wrote:
		// The server reads it from the connection it waits on.
		time.Sleep(500 * time.Millisecond)
	case status := <-done:
		t.Fatalf("POST answered %d with the database locked", status)
	case <-time.After(15 * time.Second):
		t.Fatal("POST not sent within 15 s")
	}
	cancel() // SIGTERM
	waitFor(t, "both listeners closed", func() bool {
		_, _, errMain := freshGet(base + "/healthz")
		_, _, errAdmin := freshGet(admin + "/healthz")
		return errMain != nil && errAdmin != nil
	})
	select {
	case code := <-exited:
		t.Fatalf("Run returned %d with a request in flight", code)
	default:
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	if status := <-done; status != http.StatusCreated {
		t.Errorf("in-flight request: %d, want 201", status)
	}
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("exit code %d, want 0; stderr %s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the drain")
	}
	for _, u := range []string{base, admin} {
		p, _ := url.Parse(u)
		ln, err := net.Listen("tcp", p.Host)
		if err != nil {
			t.Errorf("%s still held after Run returned: %v", p.Host, err)
			continue
		}
		_ = ln.Close()
	}
}

// An admin listener that fails while idemd serves (here: closed under it)
// stops idemd as a failing -addr does: Serve returns the error, and the API's
// listener is closed too, rather than serving on without metrics and probes.
func TestServeReturnsWhenAdminServerFails(t *testing.T) {
	t.Parallel()
	cfg, err := app.ParseConfig([]string{"-db", "sqlite:" + testdb.SQLitePath(t), "-kafka", "off", "-admin-addr", "127.0.0.1:0"}, envOf(nil))
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
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.ServeWithAdmin(ctx, ln, adminLn) }()
	waitFor(t, "the admin listener serving", func() bool {
		status, _, err := freshGet("http://" + adminLn.Addr().String() + "/livez")
		return err == nil && status == http.StatusOK
	})
	_ = adminLn.Close() // the admin server fails
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "admin") {
			t.Errorf("Serve returned %v after its admin listener failed; want an error naming it", err)
		}
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("Serve did not return within 10s after its admin server failed")
	}
	if _, _, err := freshGet("http://" + ln.Addr().String() + "/livez"); err == nil {
		t.Error("-addr still serves after Serve returned")
	}
}

package main_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/stallmeter"
)

// One embedded broker per database: a second idemd with the embedded broker
// on the same database refuses to start, at once, with one line; once the
// first is SIGKILLed, a restart on this host takes its lease over at once.
func TestEmbeddedBrokerOnePerDatabase(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			dbArg := "sqlite:" + t.TempDir() + "/idemd.db"
			if kind == "postgres" {
				dbArg = newPGDatabase(t).url.String()
			}
			args := func(dir string) []string {
				return append(commonArgs(freeAddr(t), dbArg), "-kafka-dir", dir)
			}
			first, err := c.start("first", args(t.TempDir())...)
			if err != nil {
				t.Fatal(err)
			}

			cmd := exec.Command(idemdBinary(t), args(t.TempDir())...)
			cmd.Dir = c.dir
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			m := stallmeter.Start(t)
			err = cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("second idemd: %v, want exit code 2; stdout %q stderr %q", err, stdout.String(), stderr.String())
			}
			msg := strings.TrimSpace(stderr.String())
			if strings.Count(msg, "\n") != 0 || !strings.Contains(msg, "-kafka host:port") || stdout.Len() != 0 {
				t.Errorf("second idemd said %q (stdout %q); want one line pointing to -kafka host:port", msg, stdout.String())
			}
			// A holder elsewhere is waited for up to its lease (15 s);
			// the time this process stood still on a loaded machine
			// does not count.
			if d, stalled := m.Elapsed(); d > 10*time.Second {
				t.Errorf("the refusal took %s (and the process stalled %s); want it at once for a live holder on this host", d, stalled)
			}

			if err := first.stop(syscall.SIGKILL, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			m = stallmeter.Start(t)
			if _, err := c.start("restart", args(t.TempDir())...); err != nil {
				t.Fatalf("restart after SIGKILL: %v", err)
			}
			if d, stalled := m.Elapsed(); d > 10*time.Second {
				t.Errorf("restart after a SIGKILL took %s (and the process stalled %s); want the dead holder's lease taken at once", d, stalled)
			}
		})
	}
}

// runIdemd returns a function that runs the idemd binary in dir with its
// arguments and returns its exit code, stdout and stderr.
func runIdemd(t *testing.T, dir string) func(args ...string) (int, string, string) {
	return func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(idemdBinary(t), args...)
		cmd.Dir = dir
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			return exit.ExitCode(), stdout.String(), stderr.String()
		case err != nil:
			t.Fatal(err)
		}
		return 0, stdout.String(), stderr.String()
	}
}

// idemd outbox unpark: flags checked (each mistake one line, exit 2), a
// missing database is an error (exit 1, never created). Its effect on a
// real database is tested in internal/app (TestParkedEventCounted).
func TestOutboxUnparkCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	run := runIdemd(t, dir)
	for _, bad := range [][]string{
		{"outbox", "unpark"}, {"outbox", "unpark", "-all", "-key", "17"},
		{"outbox", "unpark", "-all", "-event", "0192a2a4-6c1e-7cc2-9d3e-1d2f4a5b6c7d"},
		{"outbox", "unpark", "-event", "17"}, {"outbox", "unpark", "-all", "extra"}, {"outbox", "unpark", "-since", "2h"},
	} {
		if code, _, stderr := run(bad...); code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", bad, code, stderr)
		}
	}
	if code, stdout, _ := run("outbox", "unpark", "-h"); code != 0 || !strings.Contains(stdout, "-event ID1,ID2") {
		t.Errorf("-h: exit %d, %q", code, stdout)
	}
	if code, _, stderr := run("outbox", "unpark", "-all", "-db", dir+"/missing.db"); code != 1 {
		t.Errorf("missing database: exit %d, %q; want 1", code, stderr)
	}
	if _, err := os.Stat(dir + "/missing.db"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the missing database was created: %v", err)
	}
}

// idemd outbox redrive: flags checked, then the count of events made
// unpublished again.
func TestOutboxRedriveCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	run := runIdemd(t, dir)
	for _, bad := range [][]string{
		{"outbox"}, {"outbox", "replay"}, {"outbox", "redrive"}, {"outbox", "redrive", "-since", "2h", "-all"},
		{"outbox", "redrive", "-since", "-1h"}, {"outbox", "redrive", "-all", "extra"},
	} {
		if code, _, stderr := run(bad...); code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", bad, code, stderr)
		}
	}
	if code, stdout, _ := run("outbox", "redrive", "-h"); code != 0 || !strings.Contains(stdout, "-since DURATION") {
		t.Errorf("-h: exit %d, %q", code, stdout)
	}
	if code, _, stderr := run("outbox", "redrive", "-all", "-db", dir+"/missing.db"); code != 1 {
		t.Errorf("missing database: exit %d, %q; want 1", code, stderr)
	}

	// A real database: idemd created it, one order's event was published.
	db := newPGDatabase(t)
	c := newCluster(t)
	p, err := c.start("idemd", append(commonArgs(freeAddr(t), db.url.String()), "-kafka-dir", t.TempDir())...)
	if err != nil {
		t.Fatal(err)
	}
	l := &load{orders: makeOrders(3, 1), clients: 1, base: p.base}
	l.run(t.Context())
	published := func() int {
		var n int
		if err := db.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_published`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for published() < 6 && time.Now().Before(deadline) { // 3 created, 3 outcomes at least
		time.Sleep(100 * time.Millisecond)
	}
	if err := p.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	n := published()
	code, stdout, stderr := run("outbox", "redrive", "-since", "1h", "-db", db.url.String())
	if want := "redriven " + strconv.Itoa(n) + " events published since"; code != 0 || !strings.HasPrefix(stdout, want) {
		t.Fatalf("redrive: exit %d, stdout %q, stderr %q; want %q", code, stdout, stderr, want)
	}
	if left := published(); left != 0 {
		t.Errorf("%d rows still published after the redrive", left)
	}
}

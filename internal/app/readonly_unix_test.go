//go:build unix

package app_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
)

// TestRunSQLiteReadOnly: idemd on a SQLite file it may not write (restored
// by another user, a read-only mount) stops at once, exit 1, naming the
// file. Before, SQLite opened it read-only without a word: with -kafka
// off idemd started, /healthz said ok, and every command was answered 503
// ("attempt to write a readonly database"). "idemd migrate status", which
// writes nothing, still reads it.
func TestRunSQLiteReadOnly(t *testing.T) {
	t.Parallel()
	path := testdb.SQLitePath(t)
	if code, _, stderr := run(t, []string{"migrate", "up", "-db", path}, nil); code != 0 {
		t.Fatalf("migrate up: exit %d, %s", code, stderr)
	}
	testdb.ReadOnly(t, path)

	// Bounded: before, idemd served on until the context ended.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := app.Run(ctx, []string{"-addr", "127.0.0.1:0", "-kafka", "off", "-cleanup", "off", "-db", path}, envOf(nil), &out, &errOut)
	if ctx.Err() != nil || code != 1 || !strings.Contains(errOut.String(), path+" is not writable by this process") {
		t.Errorf("idemd on a read-only database: exit %d (after the test's deadline: %v), stdout %q, stderr %q; want exit 1 at once, saying the file is not writable",
			code, ctx.Err() != nil, out.String(), errOut.String())
	}

	code, stdout, stderr := run(t, []string{"migrate", "status", "-db", path}, nil)
	if code != 0 || !strings.Contains(stdout, "up to date") {
		t.Errorf("migrate status on a read-only database: exit %d, stdout %q, stderr %q; want 0, up to date", code, stdout, stderr)
	}
}

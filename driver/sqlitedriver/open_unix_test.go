//go:build unix

package sqlitedriver_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/testdb"
)

// Open of a file SQLite cannot use for idem says why, naming the
// directory or the file to fix, instead of SQLite's "unable to open
// database file (14)" or "attempt to write a readonly database (1544)";
// and it refuses a database file this process may not write, which SQLite
// would silently open read-only: idemd started on it, its health check
// green, and answered every command 503.
func TestOpenExplainsAnUnusablePath(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "no", "such")
	plain := t.TempDir()
	roDir := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(roDir, 0o755); err != nil {
		t.Fatal(err)
	}
	testdb.ReadOnly(t, roDir)

	// An existing database, then made read-only.
	roFile := testdb.SQLitePath(t)
	drv := open(t, roFile, nil)
	migrate(t, drv)
	if err := drv.Close(); err != nil {
		t.Fatal(err)
	}
	testdb.ReadOnly(t, roFile)

	// An existing database, writable, in a directory that is not: SQLite
	// cannot create its -wal and -shm files.
	dir := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	inRODir := filepath.Join(dir, "idem.db")
	drv = open(t, inRODir, nil)
	migrate(t, drv)
	if err := drv.Close(); err != nil {
		t.Fatal(err)
	}
	for _, side := range []string{"-wal", "-shm"} {
		if err := os.Remove(inRODir + side); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	testdb.ReadOnly(t, dir)

	// An existing database, writable, whose -wal and -shm files are not: a
	// sqlite3 run as another user (root) on it left them behind.
	sides := testdb.SQLitePath(t)
	drv = open(t, sides, nil)
	migrate(t, drv)
	if err := drv.Close(); err != nil {
		t.Fatal(err)
	}
	for _, side := range []string{"-wal", "-shm"} {
		if err := os.WriteFile(sides+side, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		testdb.ReadOnly(t, sides+side)
	}

	for _, tt := range []struct {
		name, path string
		want       []string
	}{
		{"missing directory", filepath.Join(missing, "idem.db"), []string{"directory " + missing + " does not exist"}},
		{"read-only directory", filepath.Join(roDir, "idem.db"), []string{"directory " + roDir + " is not writable by this process"}},
		{"read-only file", roFile, []string{roFile + " is not writable by this process"}},
		{"read-only directory of a database", inRODir, []string{"directory " + dir + " is not writable by this process", "-wal"}},
		{"read-only -wal and -shm", sides, []string{sides + "-wal is not writable by this process", "another user"}},
		{"a directory", plain, []string{plain + " is a directory: give the database file's path, such as " + filepath.Join(plain, "app.db")}},
		{"a directory, with a slash", plain + "/", []string{plain + "/ is a directory: give the database file's path"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := sqlitedriver.Open(tt.path, nil)
			if err == nil {
				_ = d.Close()
				t.Fatalf("Open(%s) succeeded; want an error saying why the database cannot be written", tt.path)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Open(%s): %q; want it to say %q", tt.path, err, w)
				}
			}
		})
	}
}

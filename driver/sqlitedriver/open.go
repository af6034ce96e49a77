package sqlitedriver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// checkPath refuses, before SQLite opens it, a path whose directory does
// not exist, a directory, and a database file (or its -wal or -shm file)
// this process may not write: SQLite would open such a file read-only without a word, and only
// the first write would fail ("attempt to write a readonly database").
func checkPath(path string) error {
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("sqlitedriver: open %s: directory %s does not exist (create it first: SQLite creates the file, not its directory)", path, dir)
	case err == nil && !fi.IsDir():
		return fmt.Errorf("sqlitedriver: open %s: %s is not a directory", path, dir)
	}
	fi, err = os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil // a new file: SQLite says why it cannot create it (explainOpen)
	case err == nil && fi.IsDir():
		return fmt.Errorf("sqlitedriver: open %s: %s is a directory: give the database file's path, such as %s",
			path, path, filepath.Join(path, "app.db"))
	}
	if err := writable(path); err != nil {
		return fmt.Errorf("sqlitedriver: open %s: %s is not writable by this process (%w): SQLite would open it read-only, and every write would fail", path, path, err)
	}
	// Its -wal and -shm files, left by a process of another user (a
	// sqlite3 run as root on the file) make SQLite open it read-only too.
	for _, side := range []string{path + "-wal", path + "-shm"} {
		if _, err := os.Stat(side); err != nil {
			continue
		}
		if err := writable(side); err != nil {
			return fmt.Errorf("sqlitedriver: open %s: %s is not writable by this process (%w): SQLite would open the database read-only, and every write would fail; "+
				"a process of another user (a sqlite3 run as root?) probably left it: give it to this process's user (do not delete a -wal file: it may hold committed transactions)",
				path, side, err)
		}
	}
	return nil
}

// explainOpen is the error of an Open that SQLite refused (err): when the
// file's directory is not writable by this process, it says so, since
// SQLite's own message ("unable to open database file", "attempt to write
// a readonly database") names neither the directory nor the cause.
func explainOpen(path string, err error) error {
	dir := filepath.Dir(path)
	if werr := writable(dir); werr != nil {
		return fmt.Errorf("sqlitedriver: open %s: directory %s is not writable by this process (%w): SQLite creates the database file and its -wal and -shm files in it: %w",
			path, dir, werr, err)
	}
	return fmt.Errorf("sqlitedriver: open %s: %w", path, err)
}

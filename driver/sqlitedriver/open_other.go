//go:build !unix

package sqlitedriver

// writable is not checked on this system: SQLite's own error says why a
// file cannot be opened or written.
func writable(string) error { return nil }

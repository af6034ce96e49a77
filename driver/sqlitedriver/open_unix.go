//go:build unix

package sqlitedriver

import "syscall"

// writable returns why this process may not write path (a file, or a
// directory to create files in), or nil. It opens nothing: closing a
// descriptor of a database file would drop the locks SQLite holds on it.
// access(2) sees a read-only mount, an immutable file and ACLs as open(2)
// does; it checks the real user, not the effective one (the same but in
// a set-user-ID program).
func writable(path string) error {
	const wOK = 0x2 // W_OK
	return syscall.Access(path, wOK)
}

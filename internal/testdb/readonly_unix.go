//go:build unix

package testdb

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ReadOnly makes path (a file or a directory) read-only for this process
// until the test ends: its mode, and for root, whom modes do not stop,
// the immutable attribute (chattr +i). It skips the test where neither
// makes it so (root on a file system without that attribute).
func ReadOnly(t testing.TB, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	mode := fi.Mode().Perm()
	if err := os.Chmod(path, mode&^0o222); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(path, mode) })
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chattr", "+i", path).CombinedOutput(); err != nil {
			t.Skipf("running as root, and chattr +i %s failed (%v: %s): cannot make it read-only for this process", path, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("chattr", "-i", path).Run() })
	}
	// Check that it is: a write must fail.
	if fi.IsDir() {
		err = os.WriteFile(filepath.Join(path, "probe"), nil, 0o600)
	} else {
		var f *os.File
		if f, err = os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			_ = f.Close()
		}
	}
	if err == nil {
		t.Skipf("%s is still writable by this process", path)
	}
}

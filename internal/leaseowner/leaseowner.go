// Package leaseowner names the owners of idem's leases (table idem_lock)
// and keeps a held lease renewed (Keep).
package leaseowner

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// New returns a lease owner id unique to one holder (a Cleaner, a Relay),
// readable in the idem_lock table: host, pid and random bits.
func New() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

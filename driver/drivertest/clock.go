package drivertest

import (
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

// testClock: a driver.Clock reads the database's clock, which on the test
// machine is the host's (within a second), and it moves forward.
func testClock[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	c, ok := any(newDriver(t)).(driver.Clock)
	if !ok {
		t.Skip("not a driver.Clock")
	}
	before := time.Now()
	first, err := c.DatabaseNow(t.Context())
	if err != nil {
		t.Fatalf("DatabaseNow: %v", err)
	}
	after := time.Now()
	if first.Before(before.Add(-time.Second)) || first.After(after.Add(time.Second)) {
		t.Fatalf("DatabaseNow = %s; want between %s and %s (the database runs on this host)", first, before, after)
	}
	time.Sleep(2 * time.Millisecond)
	second, err := c.DatabaseNow(t.Context())
	if err != nil {
		t.Fatalf("DatabaseNow: %v", err)
	}
	if !second.After(first) {
		t.Fatalf("DatabaseNow went from %s to %s; want it to move forward", first, second)
	}
}

package idemhttp_test

import (
	"testing"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
)

// TestNewTypedNilDriver: a nil *Driver left by an Open whose error was
// ignored is refused at New, not taken and panicking at the first call.
func TestNewTypedNilDriver(t *testing.T) {
	t.Parallel()
	var drv *sqlitedriver.Driver
	if _, err := idemhttp.New(drv, nil); err == nil {
		t.Error("New with a nil *sqlitedriver.Driver succeeded")
	}
}

package outbox_test

import (
	"context"

	"github.com/idemkit/idem/event"
	"testing"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/outbox"
)

// TestNewTypedNilDriver: a nil *Driver left by an Open whose error was
// ignored is refused at New, not taken and panicking at the first call.
func TestNewTypedNilDriver(t *testing.T) {
	t.Parallel()
	var drv *sqlitedriver.Driver
	if _, err := outbox.NewRelay(drv, outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil }), nil); err == nil {
		t.Error("New with a nil *sqlitedriver.Driver succeeded")
	}
}

package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/driver"
)

// CountParked returns how many events are parked in the outbox now: parked
// as poison by a relay and not yet unparked by an operator (see "Failures,
// backoff and poison events" in the package doc). Unlike
// RelayConfig.OnPark, which reports each park as it happens, it falls when
// an event is unparked, and it counts the whole database's, whichever relay
// parked them. It reads an index of the events that failed (the driver's
// OutboxCountParked), not the outbox, so it is cheap enough to call every
// few seconds for a gauge; do not call it per request.
func CountParked[TTx any](ctx context.Context, drv driver.OutboxDriver[TTx]) (int, error) {
	if drv == nil {
		return 0, errors.New("outbox: count parked: nil driver")
	}
	n, err := drv.Outbox().OutboxCountParked(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: count parked: %w", err)
	}
	return n, nil
}

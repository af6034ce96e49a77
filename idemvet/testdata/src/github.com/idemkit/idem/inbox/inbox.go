// Package inbox is a stub of idem's inbox for the idemvet tests.
package inbox

import (
	"context"

	"github.com/google/uuid"
)

type Inbox[TTx any] struct{}

func (*Inbox[TTx]) Process(ctx context.Context, eventID uuid.UUID, fn func(ctx context.Context, tx TTx) error) (bool, error) {
	return false, nil
}

package randomid

import (
	"github.com/google/uuid"
	"github.com/idemkit/idem/event"
)

// A test fixture: not reported.
var fixture = event.Envelope{ID: uuid.New()}

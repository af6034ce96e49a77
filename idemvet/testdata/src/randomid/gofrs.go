package randomid

import (
	gofrs "github.com/gofrs/uuid/v5"
	"github.com/idemkit/idem/event"
)

// github.com/gofrs/uuid: NewV4 is random too.

type PaymentCaptured struct {
	EventID gofrs.UUID
	Amount  int64
}

func gofrsV4() PaymentCaptured {
	return PaymentCaptured{EventID: gofrs.Must(gofrs.NewV4())} // want "event ID from a random UUIDv4"
}

func gofrsV4String() OrderPlaced {
	id, _ := gofrs.NewV4()
	return OrderPlaced{EventID: id.String()} // want "event ID from a random UUIDv4"
}

// Not reported: a v7, a name-based ID.

func gofrsV7() PaymentCaptured {
	return PaymentCaptured{EventID: gofrs.Must(gofrs.NewV7())}
}

func gofrsNamed(orderID string) event.Envelope {
	var e event.Envelope
	_ = gofrs.NewV5(gofrs.NamespaceOID, orderID)
	return e
}

package randomid

import (
	"github.com/google/uuid"
	"github.com/idemkit/idem/event"
)

type OrderPlaced struct {
	EventID string
	OrderID string
}

type Message struct {
	EventId uuid.UUID
	ID      uuid.UUID
}

func literal() event.Envelope {
	return event.Envelope{ID: uuid.New(), Type: "OrderPlaced.v1"} // want "event ID from a random UUIDv4"
}

func pointer() *event.Envelope {
	return &event.Envelope{ID: uuid.Must(uuid.NewRandom())} // want "event ID from a random UUIDv4"
}

func assigned() event.Envelope {
	var e event.Envelope
	e.ID = uuid.New() // want "event ID from a random UUIDv4"
	return e
}

func viaVariable() event.Envelope {
	id := uuid.New()
	return event.Envelope{ID: id} // want "event ID from a random UUIDv4"
}

func tuple() (event.Envelope, error) {
	var e event.Envelope
	var err error
	e.ID, err = uuid.NewRandom() // want "event ID from a random UUIDv4"
	return e, err
}

func stringField() OrderPlaced {
	return OrderPlaced{EventID: uuid.NewString(), OrderID: "o-1"} // want "event ID from a random UUIDv4"
}

func stringMethod(p *OrderPlaced) {
	p.EventID = uuid.New().String() // want "event ID from a random UUIDv4"
}

func uuidField() Message {
	return Message{EventId: uuid.New()} // want "event ID from a random UUIDv4"
}

// Shipped embeds the envelope: its ID is the envelope's.
type Shipped struct {
	event.Envelope
	OrderID string
}

type Wrapped struct{ *Shipped }

func promoted() Shipped {
	var e Shipped
	e.ID = uuid.New() // want "event ID from a random UUIDv4"
	return e
}

func promotedTwice(w Wrapped) {
	w.ID = uuid.Must(uuid.NewRandom()) // want "event ID from a random UUIDv4"
}

func embeddedLiteral() Shipped {
	return Shipped{Envelope: event.Envelope{ID: uuid.New()}} // want "event ID from a random UUIDv4"
}

// Unkeyed literals: element i is field i.
func unkeyed() OrderPlaced {
	return OrderPlaced{uuid.NewString(), "o-1"} // want "event ID from a random UUIDv4"
}

func unkeyedEnvelope() []*event.Envelope {
	return []*event.Envelope{{uuid.New(), "OrderPlaced.v1", "k", nil}} // want "event ID from a random UUIDv4"
}

// Not reported.

func unkeyedOrderID() OrderPlaced {
	return OrderPlaced{"e-1", uuid.NewString()}
}

// Parcel has an ID field of its own beside the envelope.
type Parcel struct {
	event.Envelope
	ID uuid.UUID
}

func shadowingID() Parcel {
	var p Parcel
	p.ID = uuid.New()
	return p
}

func v7() (event.Envelope, error) {
	id, err := event.NewID()
	return event.Envelope{ID: id}, err
}

func derived(parent event.Envelope) event.Envelope {
	return event.Envelope{ID: event.DerivedID(parent.ID, "refund")}
}

func uuidV7() (Message, error) {
	id, err := uuid.NewV7()
	return Message{EventId: id}, err
}

func otherField() Message {
	// A random ID that is not an event ID.
	return Message{ID: uuid.New()}
}

func orderID() OrderPlaced {
	return OrderPlaced{OrderID: uuid.NewString()}
}

// IDs from a function of the package are followed.
func newEventID() uuid.UUID { return uuid.New() }

func newEventIDErr() (uuid.UUID, error) { return uuid.NewRandom() }

type idGen struct{}

func (*idGen) next() string {
	id := uuid.NewString()
	return id
}

func fromHelper(g *idGen) (event.Envelope, OrderPlaced) {
	e := event.Envelope{ID: newEventID()} // want "event ID from a random UUIDv4"
	var err error
	e.ID, err = newEventIDErr() // want "event ID from a random UUIDv4"
	_ = err
	return e, OrderPlaced{EventID: g.next()} // want "event ID from a random UUIDv4"
}

// Not reported: the helper makes a UUIDv7.
func newV7() uuid.UUID {
	id, _ := event.NewID()
	return id
}

func fromV7Helper() event.Envelope {
	return event.Envelope{ID: newV7()}
}

// Package event is a stub of idem's event package for the idemvet tests.
package event

import "github.com/google/uuid"

type Envelope struct {
	ID      uuid.UUID
	Type    string
	Key     string
	Payload []byte
}

func NewID() (uuid.UUID, error)                          { return uuid.NewV7() }
func New(typ, key string, payload any) (Envelope, error) { return Envelope{}, nil }
func DerivedID(parent uuid.UUID, name string) uuid.UUID  { return parent }

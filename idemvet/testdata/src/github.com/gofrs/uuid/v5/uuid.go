// Package uuid is a stub of github.com/gofrs/uuid/v5 for the idemvet tests.
package uuid

type UUID [16]byte

var NamespaceOID = UUID{}

func NewV1() (UUID, error)              { return UUID{}, nil }
func NewV3(ns UUID, name string) UUID   { return UUID{} }
func NewV4() (UUID, error)              { return UUID{}, nil }
func NewV5(ns UUID, name string) UUID   { return UUID{} }
func NewV6() (UUID, error)              { return UUID{}, nil }
func NewV7() (UUID, error)              { return UUID{}, nil }
func Must(u UUID, err error) UUID       { return u }
func FromString(s string) (UUID, error) { return UUID{}, nil }
func (u UUID) String() string           { return "" }

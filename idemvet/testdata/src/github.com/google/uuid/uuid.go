// Package uuid is a stub of github.com/google/uuid for the idemvet tests.
package uuid

import "io"

type UUID [16]byte

func New() UUID                { return UUID{} }
func NewString() string        { return "" }
func NewRandom() (UUID, error) { return UUID{}, nil }
func NewV7() (UUID, error)     { return UUID{}, nil }
func NewUUID() (UUID, error)   { return UUID{}, nil }
func NewV6() (UUID, error)     { return UUID{}, nil }

func NewRandomFromReader(r io.Reader) (UUID, error) { return UUID{}, nil }
func NewV7FromReader(r io.Reader) (UUID, error)     { return UUID{}, nil }
func Must(u UUID, err error) UUID                   { return u }
func (u UUID) String() string                       { return "" }

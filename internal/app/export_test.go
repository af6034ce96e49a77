package app

import "time"

// WithParkedInterval counts the parked events every d instead of every
// parkedInterval.
func WithParkedInterval(d time.Duration) Option {
	return func(a *App) { a.parkedEvery = d }
}

// DropReadOnly is the pool's PrepareConn.
var DropReadOnly = dropReadOnly

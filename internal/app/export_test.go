package app

import "time"

// WithParkedInterval counts the parked events every d instead of every
// parkedInterval.
func WithParkedInterval(d time.Duration) Option {
	return func(a *App) { a.parkedEvery = d }
}

// DropReadOnly is the pool's PrepareConn.
var DropReadOnly = dropReadOnly

// WithStartTimeout is opts with the start-up bound d instead of
// startTimeout.
func WithStartTimeout(opts Options, d time.Duration) Options {
	opts.startTimeout = d
	return opts
}

package app

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// WithParkedInterval counts the parked events every d instead of every
// parkedInterval.
func WithParkedInterval(d time.Duration) Option {
	return func(a *App) { a.parkedEvery = d }
}

// DropReadOnly is the pool's PrepareConn.
var DropReadOnly = dropReadOnly

// AskReadOnly is the pool's AfterConnect, asking also a server that reports
// whether the session is read-only.
func AskReadOnly(ctx context.Context, conn *pgx.Conn) error {
	return readOnlyAtConnect(ctx, conn, true)
}

// WithStartTimeout is opts with the start-up bound d instead of
// startTimeout.
func WithStartTimeout(opts Options, d time.Duration) Options {
	opts.startTimeout = d
	return opts
}

package main

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// rtCounter is a pgx tracer that counts round trips to PostgreSQL: every
// query (BEGIN and COMMIT included, pgx sends them as queries) is one, every
// pipelined batch is one whatever its length. Statements counts what was
// sent. Statement preparation, done once per connection and statement by
// pgx's cache, is not counted.
type rtCounter struct {
	roundTrips atomic.Int64
	statements atomic.Int64
}

var (
	_ pgx.QueryTracer = (*rtCounter)(nil)
	_ pgx.BatchTracer = (*rtCounter)(nil)
)

// TraceQueryStart implements pgx.QueryTracer.
func (c *rtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.roundTrips.Add(1)
	c.statements.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *rtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer.
func (c *rtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	c.roundTrips.Add(1)
	if data.Batch != nil {
		c.statements.Add(int64(data.Batch.Len()))
	}
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (c *rtCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *rtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// counts is a snapshot of an rtCounter.
type counts struct{ roundTrips, statements int64 }

func (c *rtCounter) snapshot() counts {
	return counts{c.roundTrips.Load(), c.statements.Load()}
}

package pgsql

import (
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/driver"
)

// OutboxInsertArrays are the array arguments $2-$8 of OutboxInsertSQL, one
// element per row in the rows' order ($1, the event IDs, is left to each
// backend: its UUID type differs). Absent saga IDs and headers are nil.
type OutboxInsertArrays struct {
	Types, Keys       []string
	Sagas             []*string
	Payloads          [][]byte
	Headers           []*string
	Occurred, Created []time.Time
}

// NewOutboxInsertArrays splits rows into OutboxInsertSQL's arrays.
func NewOutboxInsertArrays(rows []driver.OutboxRow) OutboxInsertArrays {
	a := OutboxInsertArrays{
		Types:    make([]string, len(rows)),
		Keys:     make([]string, len(rows)),
		Sagas:    make([]*string, len(rows)),
		Payloads: make([][]byte, len(rows)),
		Headers:  make([]*string, len(rows)),
		Occurred: make([]time.Time, len(rows)),
		Created:  make([]time.Time, len(rows)),
	}
	for i := range rows {
		r := &rows[i]
		a.Types[i] = r.EventType
		a.Keys[i] = r.Key
		if r.SagaID != "" {
			a.Sagas[i] = &r.SagaID
		}
		a.Payloads[i] = r.Payload
		if r.Headers != nil {
			h := string(r.Headers)
			a.Headers[i] = &h
		}
		a.Occurred[i] = r.OccurredAt
		a.Created[i] = r.CreatedAt
	}
	return a
}

// ReadBound keeps a claim's rows within its MaxBytes
// (driver.OutboxClaimBatchParams) on PostgreSQL, at no cost for small
// events. A claim reads its rows with OutboxReadSQL and keeps them, in the
// order read, until their payloads would pass MaxBytes (always the first):
// the rows after the cut are sent by the server and dropped as they arrive,
// never held. When a claim reads half of MaxBytes or more, the payloads are
// large: the claims that follow use OutboxReadBoundedSQL, which cuts on the
// server, so that the rows left out are not sent either, until one reads
// less than half of MaxBytes. The state is shared by the claims of a
// driver.
type ReadBound struct{ large atomic.Bool }

// Statement returns the read statement of a claim with maxBytes, and
// whether it takes maxBytes as its fourth argument.
func (b *ReadBound) Statement(maxBytes int) (sql string, bounded bool) {
	if maxBytes > 0 && b.large.Load() {
		return OutboxReadBoundedSQL, true
	}
	return OutboxReadSQL, false
}

// Cut scans the rows of a claim with maxBytes through next, which returns
// the next row and its payload's size, and false when there is none left
// (or it failed: its caller reports the error). It returns the rows kept.
func Cut[R any](b *ReadBound, maxBytes int, next func() (R, int, bool)) []R {
	var (
		out        []R
		read, kept int
		cut        bool
	)
	for {
		r, size, ok := next()
		if !ok {
			break
		}
		read += size
		// Once a row is left out, every later one is (a later row of its
		// key must not go before it).
		if cut = cut || maxBytes > 0 && len(out) > 0 && kept+size > maxBytes; cut {
			continue // read on: the statement's rows are drained, not kept
		}
		kept += size
		out = append(out, r)
	}
	if maxBytes > 0 {
		b.large.Store(read >= maxBytes/2)
	}
	return out
}

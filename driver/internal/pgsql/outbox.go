package pgsql

import (
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

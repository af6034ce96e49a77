package pgdriver

import (
	"bytes"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

func testIDs(n int) []uuid.UUID {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	return ids
}

// TestUUIDArrayEncodesAsSlice: uuidArray goes on the wire exactly as the
// []pgtype.UUID it replaces, in both formats.
func TestUUIDArrayEncodesAsSlice(t *testing.T) {
	m := pgtype.NewMap()
	for _, n := range []int{0, 1, 3, 500} {
		a := newUUIDArray(testIDs(n))
		for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
			vals := make([]pgtype.UUID, len(a))
			for i, p := range a {
				vals[i] = *p
			}
			want, err := m.Encode(pgtype.UUIDArrayOID, format, vals, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, oid := range []uint32{pgtype.UUIDArrayOID, 0} { // 0: the type from the Go type
				got, err := m.Encode(oid, format, a, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%d ids, format %d, OID %d: uuidArray encodes as %q, []pgtype.UUID as %q", n, format, oid, got, want)
				}
			}
		}
	}
}

// BenchmarkUUIDArrayEncode builds and encodes InboxInsert's uuid[] argument
// for a poll of 500 events: uuidArray, and the []pgtype.UUID it replaced.
func BenchmarkUUIDArrayEncode(b *testing.B) {
	m := pgtype.NewMap()
	ids := testIDs(500)
	buf := make([]byte, 0, 16<<10)
	for _, c := range []struct {
		name string
		arg  func() any
	}{
		{"uuidArray", func() any { return newUUIDArray(ids) }},
		{"slice", func() any { // what InboxInsert passed before
			a := make([]pgtype.UUID, len(ids))
			for i, id := range ids {
				a[i] = pgtype.UUID{Bytes: id, Valid: true}
			}
			return a
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, c.arg(), buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

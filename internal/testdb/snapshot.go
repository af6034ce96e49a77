package testdb

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Snapshot is a copy of a schema's rows and sequence values, taken as a
// backup (or the last commit an asynchronous replica received) would be.
type Snapshot struct {
	schema, copy string
	tables       []snapTable
	sequences    map[string]seqValue
}

type snapTable struct {
	name    string
	columns string // quoted, comma-separated, without generated columns
}

type seqValue struct {
	last   int64
	called bool
}

// TakeSnapshot copies every table of schema (each partition of a
// partitioned one) and the values of its sequences into a schema of its
// own, dropped when the test ends. Restore puts them back. The copy is
// taken in one REPEATABLE READ transaction, so it is one consistent point
// in time, like pg_dump's.
func TakeSnapshot(t testing.TB, schema string) *Snapshot {
	t.Helper()
	ctx := context.Background()
	c, err := connect(ctx)
	if err != nil {
		t.Fatalf("snapshot: connect: %v", err)
	}
	defer func() { _ = c.Close(ctx) }()
	s := &Snapshot{schema: schema, copy: "snap_" + randHex(6), sequences: map[string]seqValue{}}
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatalf("snapshot: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `
		SELECT c.relname, string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
		FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
		WHERE n.nspname = $1 AND c.relkind = 'r'
		GROUP BY c.relname ORDER BY c.relname`, schema)
	if err != nil {
		t.Fatalf("snapshot: list tables: %v", err)
	}
	s.tables, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (snapTable, error) {
		var st snapTable
		err := r.Scan(&st.name, &st.columns)
		return st, err
	})
	if err != nil {
		t.Fatalf("snapshot: list tables: %v", err)
	}
	seqs, err := tx.Query(ctx, `SELECT sequencename FROM pg_sequences WHERE schemaname = $1`, schema)
	if err != nil {
		t.Fatalf("snapshot: list sequences: %v", err)
	}
	names, err := pgx.CollectRows(seqs, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("snapshot: list sequences: %v", err)
	}
	for _, name := range names {
		var v seqValue
		if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT last_value, is_called FROM %s.%s`, schema, pgx.Identifier{name}.Sanitize())).Scan(&v.last, &v.called); err != nil {
			t.Fatalf("snapshot: read sequence %s: %v", name, err)
		}
		s.sequences[name] = v
	}
	if _, err := tx.Exec(ctx, "CREATE SCHEMA "+s.copy); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for _, st := range s.tables {
		q := fmt.Sprintf(`CREATE TABLE %s.%s AS SELECT %s FROM %s.%s`, s.copy, pgx.Identifier{st.name}.Sanitize(), st.columns, schema, pgx.Identifier{st.name}.Sanitize())
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("snapshot: copy %s: %v", st.name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("snapshot: commit: %v", err)
	}
	t.Cleanup(func() {
		c, err := connect(context.Background())
		if err != nil {
			return
		}
		_, _ = c.Exec(context.Background(), "DROP SCHEMA "+s.copy+" CASCADE")
		_ = c.Close(context.Background())
	})
	return s
}

// Restore puts the snapshot back, as a restore from that backup (or a
// failover to that replica) would: the rows written since are gone, those
// updated or deleted since are as they were, the sequences hand out the
// same values again. Triggers do not fire and foreign keys are not
// checked meanwhile (session_replication_role = replica), as under
// pg_restore. Stop whatever writes to the schema first.
func (s *Snapshot) Restore(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	c, err := connect(ctx)
	if err != nil {
		t.Fatalf("restore: connect: %v", err)
	}
	defer func() { _ = c.Close(ctx) }()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatalf("restore: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
		t.Fatalf("restore: %v", err)
	}
	names := make([]string, len(s.tables))
	for i, st := range s.tables {
		names[i] = s.schema + "." + pgx.Identifier{st.name}.Sanitize()
	}
	if len(names) > 0 {
		if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(names, ", ")); err != nil {
			t.Fatalf("restore: truncate: %v", err)
		}
	}
	for i, st := range s.tables {
		q := fmt.Sprintf(`INSERT INTO %s (%s) OVERRIDING SYSTEM VALUE SELECT %s FROM %s.%s`, names[i], st.columns, st.columns, s.copy, pgx.Identifier{st.name}.Sanitize())
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("restore: %s: %v", st.name, err)
		}
	}
	for name, v := range s.sequences {
		q := fmt.Sprintf(`SELECT setval('%s.%s', $1, $2)`, s.schema, pgx.Identifier{name}.Sanitize())
		if _, err := tx.Exec(ctx, q, v.last, v.called); err != nil {
			t.Fatalf("restore: sequence %s: %v", name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("restore: commit: %v", err)
	}
}

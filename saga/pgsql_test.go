package saga_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idem/internal/testdb"
)

// setupPostgresSQL is PostgreSQL over database/sql (pgsqldriver). Its crash
// children run pgdriver on the same schema: the two drivers share tables.
func setupPostgresSQL(t *testing.T) *fixture[*sql.Tx] {
	t.Helper()
	drv, schema := testdb.PostgresSQLSchema(t)
	db := drv.DB()
	if _, err := db.ExecContext(t.Context(), pgTables); err != nil {
		t.Fatalf("create effect table: %v", err)
	}
	return &fixture[*sql.Tx]{
		drv: drv,
		effect: func(ctx context.Context, tx *sql.Tx, sagaID, step string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effect (saga_id, step) VALUES ($1, $2)`, sagaID, step)
			return err
		},
		bad: sqlBad,
		log: func(t *testing.T, sagaID string) []string {
			return testdb.Strings(t, db, `SELECT step FROM effect WHERE saga_id = $1 ORDER BY id`, sagaID)
		},
		outbox: func(t *testing.T, id uuid.UUID) []string {
			return testdb.Strings(t, db, `SELECT convert_from(payload, 'UTF8') FROM outbox WHERE event_id = $1`, id.String())
		},
		kill: func(t *testing.T, tx *sql.Tx) { testdb.TerminateSQL(t, db, tx) },
		exec: func(ctx context.Context, tx *sql.Tx, stmt string) error {
			_, err := tx.ExecContext(ctx, stmt)
			return err
		},
		childEnv: []string{envBackend + "=postgres", envTarget + "=" + schema},
	}
}

func TestPostgresSQL(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	runScenarios(t, setupPostgresSQL)
}

package inbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idem/internal/testdb"
)

// setupPostgresSQL is PostgreSQL over database/sql (pgsqldriver). Its crash
// child runs pgdriver on the same schema: the two drivers share tables.
func setupPostgresSQL(t *testing.T) *fixture[*sql.Tx] {
	t.Helper()
	drv, schema := testdb.PostgresSQLSchema(t)
	db := drv.DB()
	if _, err := db.ExecContext(t.Context(), pgEffectTable); err != nil {
		t.Fatalf("create effect table: %v", err)
	}
	count := func(t *testing.T, query, consumer string, id uuid.UUID) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(t.Context(), query, consumer, id.String()).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	return &fixture[*sql.Tx]{
		drv: drv,
		effect: func(ctx context.Context, tx *sql.Tx, consumer string, id uuid.UUID) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effect (event_id, consumer) VALUES ($1, $2)`, id.String(), consumer)
			return err
		},
		effects: func(t *testing.T, consumer string, id uuid.UUID) int {
			return count(t, `SELECT count(*) FROM effect WHERE consumer = $1 AND event_id = $2`, consumer, id)
		},
		processed: func(t *testing.T, consumer string, id uuid.UUID) int {
			return count(t, `SELECT count(*) FROM processed_event WHERE consumer_name = $1 AND event_id = $2`, consumer, id)
		},
		kill:     func(t *testing.T, tx *sql.Tx) { testdb.TerminateSQL(t, db, tx) },
		childEnv: []string{envBackend + "=postgres", envTarget + "=" + schema},
	}
}

func TestPostgresSQL(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	runScenarios(t, setupPostgresSQL)
}

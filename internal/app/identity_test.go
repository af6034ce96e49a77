package app

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// A deployment migrates as the schema's owner, then runs idemd as a role
// that may read and write the tables but not create any (PostgreSQL 15's
// default for public): idemd migrate up creates idemd_instance too, and
// the start-up names the database without DDL.
func TestIdentityWithoutCreatePrivilege(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	owner, schema := testdb.Schema(t, 2)
	dsn := testdb.DSN()
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	var out, errOut strings.Builder
	if code := runMigrate(ctx, []string{"up", "-db", dsn + sep + "search_path=" + schema}, func(string) string { return "" }, nil, &out, &errOut); code != 0 {
		t.Fatalf("migrate up: %d %s %s", code, out.String(), errOut.String())
	}
	var want string
	if err := owner.QueryRow(ctx, `SELECT id FROM idemd_instance`).Scan(&want); err != nil {
		t.Fatalf("idemd_instance after migrate up: %v", err)
	}
	app := testdb.DMLPool(t, owner, schema)
	id, err := postgresIdentity(ctx, app)
	if err != nil {
		t.Fatalf("identity as a role without CREATE rights: %v", err)
	}
	if id.Instance != want {
		t.Errorf("instance %q, want %q", id.Instance, want)
	}
}

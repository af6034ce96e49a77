package app

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// A deployment migrates as the tables' owner (idemd migrate up), then runs
// idemd as a role granted SELECT, INSERT, UPDATE and DELETE on them; a
// table created later without a grant for the role (a migration of a new
// release, without ALTER DEFAULT PRIVILEGES) refuses the start, naming the
// table and the GRANT, instead of every order failing from the first one
// on (500, "permission denied for table outbox_pending").
func TestStartRefusesMissingPrivileges(t *testing.T) {
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
	testdb.DMLPool(t, owner, schema)
	role := schema + "_dml"
	cfg, err := ParseConfig([]string{"-db", strings.Replace(dsn, "postgres@", role+"@", 1) + sep + "search_path=" + schema,
		"-kafka", "off", "-cleanup", "off"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	start := func() error {
		a, err := New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil {
			a.Close()
		}
		return err
	}
	if err := start(); err != nil {
		t.Fatalf("start with every privilege: %v", err)
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := owner.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, c := range []struct{ table, want string }{
		{"outbox_pending", `the role "` + role + `" lacks privileges on idem's tables: outbox_pending (SELECT, INSERT, UPDATE, DELETE); as their owner, run GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_pending TO "` + role + `"`},
		{"customer_order_summary", `the role "` + role + `" lacks privileges on idemd's tables: customer_order_summary (SELECT, INSERT, UPDATE); as their owner, run GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "` + schema + `" TO "` + role + `"`},
	} {
		exec(`REVOKE ALL ON ` + c.table + ` FROM ` + role)
		if err := start(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("start without privileges on %s: %v; want an error saying %q", c.table, err, c.want)
		}
		exec(`GRANT SELECT, INSERT, UPDATE, DELETE ON ` + c.table + ` TO ` + role)
	}
	if err := start(); err != nil {
		t.Fatalf("start once granted again: %v", err)
	}
	// What idem and idemd never do is not asked for: no payment nor
	// order is deleted, no payment updated, no outbox row updated (a
	// payments team's DBA grants no more).
	exec(`REVOKE UPDATE, DELETE ON payment FROM ` + role)
	exec(`REVOKE DELETE ON customer_order, customer_order_summary FROM ` + role)
	exec(`REVOKE UPDATE ON outbox FROM ` + role)
	if err := start(); err != nil {
		t.Fatalf("start without the privileges no statement uses: %v", err)
	}
}

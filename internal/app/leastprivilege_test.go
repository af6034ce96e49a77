package app_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
)

// The README's "Roles and privileges", as written: the schema belongs to
// the migrating role (no CREATE on the database), which runs idemd migrate
// up; the service's role has USAGE on the schema and, through ALTER
// DEFAULT PRIVILEGES alone, SELECT, INSERT, UPDATE and DELETE on every
// table the migrations create. idemd starts as that role (its start-up
// checks find every privilege), takes payments and orders, relays their
// events through Kafka, runs the saga and the projection, and its
// migrate status reads the schema.
func TestLeastPrivilegeDeployment(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin, schema := testdb.Schema(t, 2)
	deploy := testdb.SchemaOwner(t, schema)
	svc := schema + "_svc"
	exec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE ROLE ` + svc + ` LOGIN`)
	t.Cleanup(func() {
		bg := context.Background()
		_, _ = admin.Exec(bg, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = $1`, svc)
		_, _ = admin.Exec(bg, `ALTER DEFAULT PRIVILEGES FOR ROLE `+deploy+` IN SCHEMA `+schema+` REVOKE ALL ON TABLES FROM `+svc)
		_, _ = admin.Exec(bg, `DROP OWNED BY `+svc)
		_, _ = admin.Exec(bg, `DROP ROLE IF EXISTS `+svc)
	})
	exec(`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + svc)
	exec(`ALTER DEFAULT PRIVILEGES FOR ROLE ` + deploy + ` IN SCHEMA ` + schema +
		` GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO ` + svc)

	as := func(role string) string {
		u, err := url.Parse(testdb.DSN())
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User(role)
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	var out, errOut strings.Builder
	if code := app.Run(ctx, []string{"migrate", "up", "-db", as(deploy)}, envOf(nil), &out, &errOut); code != 0 {
		t.Fatalf("migrate up as %s: %d %s %s", deploy, code, out.String(), errOut.String())
	}
	out.Reset()
	if code := app.Run(ctx, []string{"migrate", "status", "-db", as(svc)}, envOf(nil), &out, &errOut); code != 0 || !strings.Contains(out.String(), "up to date") {
		t.Fatalf("migrate status as %s: %d %s %s", svc, code, out.String(), errOut.String())
	}

	s := serveOn(t, as(svc), func(table string) int {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Errorf("count: %v", err)
		}
		return n
	})
	if r := s.do(http.MethodPost, "/v1/payments", "pay-1", paymentBody("least-1")); r.status != http.StatusCreated {
		t.Fatalf("POST payment: %d %s", r.status, r.body)
	}
	if r := s.do(http.MethodPost, "/v1/payments", "pay-1", paymentBody("least-1")); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("POST payment again: %d %v %s", r.status, r.header, r.body)
	}
	created := s.do(http.MethodPost, "/v1/orders", "order-1", orderBody(42, "19.90"))
	if created.status != http.StatusCreated {
		t.Fatalf("POST order: %d %s", created.status, created.body)
	}
	id, _ := created.json(t)["id"].(string)
	s.waitStatus(id, "CONFIRMED")
	s.waitSummary(42, "orders=1 pending=0 confirmed=1 rejected=0 total_amount=19.9000")
	s.waitCount("outbox_pending", 0)
}

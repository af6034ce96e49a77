package idemvet

import (
	"slices"
	"testing"
)

func TestIsReadOnlySQL(t *testing.T) {
	for q, want := range map[string]bool{
		"SELECT count(*) FROM products":                                                               true,
		"  (select 1) union (select 2)":                                                               true,
		"SELECT * FROM stock WHERE id = $1 FOR UPDATE":                                                false,
		"SELECT * FROM stock\nFOR UPDATE SKIP LOCKED":                                                 false,
		"SELECT updated_at FROM orders":                                                               true,
		"SELECT 'delete' AS word -- insert":                                                           true,
		"WITH p AS (SELECT price FROM products) SELECT sum(price) FROM p":                             true,
		"with recursive t(n) as (values (1) union all select n+1 from t where n < 5) select * from t": true,
		"WITH d AS (DELETE FROM carts RETURNING id) SELECT count(*) FROM d":                           false,
		"WITH n AS (SELECT 1) INSERT INTO orders SELECT * FROM n":                                     false,
		"WITH s AS (SELECT 1) SELECT * FROM stock FOR UPDATE":                                         false,
		"-- current price\nSELECT price FROM products WHERE id = $1":                                  true,
		"/* report */ SELECT sum(total) FROM orders":                                                  true,
		"/* outer /* nested */ still a comment */ SELECT 1":                                           true,
		"-- count\n/* audit */\n  WITH x AS (SELECT 1) SELECT * FROM x":                               true,
		"-- SELECT\nINSERT INTO audit VALUES (1)":                                                     false,
		"/* SELECT */ DELETE FROM sessions":                                                           false,
		"INSERT INTO audit VALUES (1)":                                                                false,
		"UPDATE stock SET n = n - 1":                                                                  false,
		"":                                                                                            false,
		"-- only a comment":                                                                           false,
		`WITH "insert" AS (SELECT 1) SELECT * FROM "insert"`:                                          true,
		// Every locking clause locks only until the pool's statement
		// ends, not for the handler's transaction.
		"SELECT n FROM stock WHERE id = $1 FOR NO KEY UPDATE":         false,
		"SELECT n FROM stock WHERE id = $1 FOR SHARE":                 false,
		"SELECT n FROM stock WHERE id = $1 FOR KEY SHARE SKIP LOCKED": false,
		"WITH s AS (SELECT 1) SELECT * FROM stock FOR SHARE":          false,
		"SELECT substring(name FROM 1 FOR 3) FROM products":           true,
		// EXPLAIN ANALYZE runs the statement it explains.
		"EXPLAIN ANALYZE DELETE FROM sessions":              false,
		"EXPLAIN (ANALYZE, BUFFERS) UPDATE stock SET n = 0": false,
		"EXPLAIN ANALYSE SELECT * FROM stock FOR UPDATE":    false,
		"EXPLAIN ANALYZE SELECT count(*) FROM orders":       true,
		"EXPLAIN DELETE FROM sessions":                      true,
	} {
		if got := isReadOnlySQL(q); got != want {
			t.Errorf("isReadOnlySQL(%q) = %v, want %v", q, got, want)
		}
	}
}

func TestSQLTables(t *testing.T) {
	for _, tc := range []struct {
		q      string
		reads  []string
		insert string
	}{
		{q: "SELECT 1 FROM processed_event WHERE id = $1", reads: []string{"processed_event"}},
		{q: `select 1 from "Public"."Processed_Events" e join ONLY idem.inbox i on true`, reads: []string{"processed_events", "inbox"}},
		{q: "SELECT EXISTS (SELECT 1 FROM `dedup` WHERE k = ?)", reads: []string{"dedup"}},
		{q: "/* FROM x */ SELECT now() -- FROM y", reads: nil},
		{q: "SELECT 'FROM inbox' FROM (SELECT 1) s", reads: nil},
		{q: "WITH s AS (SELECT id FROM inbox) SELECT * FROM s", reads: []string{"inbox", "s"}},
		{q: "WITH s AS (DELETE FROM inbox RETURNING id) SELECT * FROM s", reads: nil},
		{q: "DELETE FROM inbox", reads: nil},
		{q: "INSERT INTO processed_event (id) VALUES ($1)", insert: "processed_event"},
		{q: "INSERT OR IGNORE INTO main.\"Inbox\" VALUES (?)", insert: "inbox"},
		{q: "insert into idem . idempotency_record select * from x", reads: nil, insert: "idempotency_record"},
		{q: "UPDATE inbox SET n = 1", insert: ""},
	} {
		if got := selectTables(tc.q); !slices.Equal(got, tc.reads) {
			t.Errorf("selectTables(%q) = %q, want %q", tc.q, got, tc.reads)
		}
		if got, _ := insertTable(tc.q); got != tc.insert {
			t.Errorf("insertTable(%q) = %q, want %q", tc.q, got, tc.insert)
		}
	}
	for name, want := range map[string]bool{
		"processed_event": true, "processed_events": true, "processed_messages": true,
		"idempotency_record": true, "idempotency_keys": true, "inbox": true, "orders_inbox": true,
		"dedup": true, "dedup_keys": true, "orders": false, "inboxes_archive": false, "event": false,
	} {
		if got := isDedupTable(name); got != want {
			t.Errorf("isDedupTable(%q) = %v, want %v", name, got, want)
		}
	}
}

package idemvet

import "testing"

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

package idemvet

import (
	"fmt"
	"go/ast"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// CheckInsert reports deduplication by SELECT then INSERT, which lets two
// concurrent deliveries both find no row.
var CheckInsert = &analysis.Analyzer{
	Name: "idemcheckinsert",
	Doc:  "report a SELECT from a dedup table followed by an INSERT into it without ON CONFLICT DO NOTHING",
	Run:  runCheckInsert,
}

const msgCheckInsert = "check-then-insert on %s races: insert with ON CONFLICT DO NOTHING and treat 0 rows as a duplicate"

// queryNames are the methods that run a statement and return its rows.
var queryNames = []string{"Query", "QueryContext", "QueryRow", "QueryRowContext"}

func runCheckInsert(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	assigns := assignments(pass)
	r := newReporter(pass)
	funcBodies(pass, func(body *ast.BlockStmt) {
		checked := make(map[string]bool) // dedup tables a query read
		ast.Inspect(body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			fn := callee(info, call)
			if fn == nil || dbHandle(fn) == notDB || !contains(sqlNames, fn.Name()) {
				return true
			}
			q, ok := sqlArg(info, assigns, call)
			if !ok {
				return true
			}
			if contains(queryNames, fn.Name()) {
				for _, t := range selectTables(q) {
					if isDedupTable(t) {
						checked[t] = true
					}
				}
			}
			if t, ok := insertTable(q); ok && checked[t] && !dedupSQL(q) && !onConflict(q) {
				r.report(call, fmt.Sprintf(msgCheckInsert, t))
			}
			return true
		})
	})
	return nil, nil
}

// selectTables returns the tables a query reads, in lower case without
// their schema: the names after FROM and JOIN (in subqueries too) of a
// statement that starts with SELECT, or with WITH and writes nothing.
func selectTables(q string) []string {
	toks := sqlTokens(q)
	words := sqlWords(q)
	if len(words) == 0 {
		return nil
	}
	switch words[0] {
	case "SELECT":
	case "WITH":
		for _, w := range words {
			if contains([]string{"INSERT", "UPDATE", "DELETE", "MERGE"}, w) {
				return nil
			}
		}
	default:
		return nil
	}
	var tables []string
	for i, t := range toks {
		if t.kind == sqlWord && (t.text == "FROM" || t.text == "JOIN") {
			if name, ok := sqlTableName(toks[i+1:]); ok {
				tables = append(tables, name)
			}
		}
	}
	return tables
}

// insertTable returns the table an INSERT statement inserts into, in
// lower case without its schema.
func insertTable(q string) (string, bool) {
	toks := sqlTokens(q)
	if len(toks) == 0 || toks[0].kind != sqlWord || toks[0].text != "INSERT" {
		return "", false
	}
	for i, t := range toks {
		if t.kind == sqlWord && t.text == "INTO" {
			return sqlTableName(toks[i+1:])
		}
	}
	return "", false
}

// sqlTableName reads a table name, quoted or not and qualified or not
// (schema.table), at the start of toks, and returns its last part in lower
// case. ONLY before the name (PostgreSQL) is skipped.
func sqlTableName(toks []sqlToken) (string, bool) {
	if len(toks) > 0 && toks[0].kind == sqlWord && toks[0].text == "ONLY" {
		toks = toks[1:]
	}
	name, ok := "", false
	for len(toks) > 0 && (toks[0].kind == sqlWord || toks[0].kind == sqlName) {
		name, ok = strings.ToLower(toks[0].text), true
		if len(toks) < 3 || toks[1].kind != sqlPunct || toks[1].text != "." {
			break
		}
		toks = toks[2:]
	}
	return name, ok
}

// onConflict reports whether q has an ON CONFLICT clause.
func onConflict(q string) bool {
	words := sqlWords(q)
	for i := 0; i+1 < len(words); i++ {
		if words[i] == "ON" && words[i+1] == "CONFLICT" {
			return true
		}
	}
	return false
}

// isDedupTable reports whether a table (its lower-case name without schema)
// holds the keys of what was already processed: inbox, any name ending in
// _inbox, any name starting with processed_ (processed_events,
// processed_webhooks, ...), idempotency (idempotency_keys,
// idempotency_records, ...) or dedup, and webhook_event(s) alone or ending
// a name (stripe_webhook_events): what webhook receivers call the table of
// the event IDs they applied.
func isDedupTable(name string) bool {
	if name == "inbox" || strings.HasSuffix(name, "_inbox") {
		return true
	}
	for _, prefix := range []string{"processed_", "idempotency", "dedup"} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	w := strings.TrimSuffix(name, "s")
	return w == "webhook_event" || strings.HasSuffix(w, "_webhook_event")
}

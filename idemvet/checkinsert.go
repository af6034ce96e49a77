package idemvet

import (
	"fmt"
	"go/ast"
	"go/types"
	"maps"
	"slices"
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
	sums := &checkInsertSummaries{pass: pass, assigns: assigns, done: make(map[*types.Func]*checkInsertSummary)}
	funcBodies(pass, func(body *ast.BlockStmt) {
		checked := make(map[string]string) // dedup tables read: where ("" here)
		ast.Inspect(body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			fn := callee(info, call)
			// A function or method of the package that reads or inserts
			// into a dedup table: repo.IsProcessed, then repo.MarkProcessed.
			if sum := sums.of(fn); sum != nil {
				for _, t := range sortedKeys(sum.inserts) {
					if where, ok := checked[t]; ok {
						r.report(call, fmt.Sprintf(msgCheckInsert, t)+checkedIn(where, fn))
					}
				}
				for t := range sum.checks {
					if _, ok := checked[t]; !ok {
						checked[t] = fn.Name()
					}
				}
				return true
			}
			q, isQuery, ok := dbSQL(info, assigns, call)
			if !ok {
				return true
			}
			if isQuery {
				for _, t := range selectTables(q) {
					if isDedupTable(t) {
						if _, ok := checked[t]; !ok {
							checked[t] = ""
						}
					}
				}
			}
			if t, ok := plainDedupInsert(q); ok {
				if where, ok := checked[t]; ok {
					r.report(call, fmt.Sprintf(msgCheckInsert, t)+checkedIn(where, nil))
				}
			}
			return true
		})
	})
	return nil, nil
}

// checkedIn says, for a report, where the check and the insert are when a
// function of the package does one of them ("" when both are in the
// reported function).
func checkedIn(checkedBy string, insertedBy *types.Func) string {
	switch {
	case checkedBy != "" && insertedBy != nil:
		return fmt.Sprintf(" (checked in %s, inserted in %s)", checkedBy, insertedBy.Name())
	case checkedBy != "":
		return fmt.Sprintf(" (checked in %s)", checkedBy)
	case insertedBy != nil:
		return fmt.Sprintf(" (inserted in %s)", insertedBy.Name())
	}
	return ""
}

// dbSQL returns the constant SQL of a call of a database handle's
// Exec/Query/QueryRow (and ...Context), and whether it is a query.
func dbSQL(info *types.Info, assigns map[types.Object][]assignment, call *ast.CallExpr) (q string, isQuery, ok bool) {
	fn := callee(info, call)
	if fn == nil || dbHandle(fn) == notDB || !contains(sqlNames, fn.Name()) {
		return "", false, false
	}
	q, ok = sqlArg(info, assigns, call)
	return q, contains(queryNames, fn.Name()), ok
}

// plainDedupInsert returns the dedup table q inserts into without skipping
// a row already there.
func plainDedupInsert(q string) (string, bool) {
	t, ok := insertTable(q)
	if !ok || !isDedupTable(t) || dedupSQL(q) || onConflict(q) {
		return "", false
	}
	return t, true
}

// checkInsertSummary is what a function of the package does to dedup
// tables, itself or through the package's functions it calls (three calls
// deep): the tables it reads, and those it inserts into without ON
// CONFLICT.
type checkInsertSummary struct {
	checks, inserts map[string]bool
}

type checkInsertSummaries struct {
	pass    *analysis.Pass
	assigns map[types.Object][]assignment
	done    map[*types.Func]*checkInsertSummary
	depth   int
}

// of returns fn's summary, or nil when fn is not a function of the package
// that touches a dedup table.
func (c *checkInsertSummaries) of(fn *types.Func) *checkInsertSummary {
	if s, ok := c.done[fn]; ok {
		return s
	}
	decl := funcDecl(c.pass, fn)
	if decl == nil || c.depth >= 3 {
		return nil
	}
	c.done[fn] = nil // a recursive call adds nothing
	c.depth++
	defer func() { c.depth-- }()
	s := &checkInsertSummary{checks: make(map[string]bool), inserts: make(map[string]bool)}
	info := c.pass.TypesInfo
	ast.Inspect(decl.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if sub := c.of(callee(info, call)); sub != nil {
			maps.Copy(s.checks, sub.checks)
			maps.Copy(s.inserts, sub.inserts)
			return true
		}
		q, isQuery, ok := dbSQL(info, c.assigns, call)
		if !ok {
			return true
		}
		if isQuery {
			for _, t := range selectTables(q) {
				if isDedupTable(t) {
					s.checks[t] = true
				}
			}
		}
		if t, ok := plainDedupInsert(q); ok {
			s.inserts[t] = true
		}
		return true
	})
	if len(s.checks) == 0 && len(s.inserts) == 0 {
		s = nil
	}
	c.done[fn] = s
	return s
}

// sortedKeys returns m's keys in order (reports in a stable order).
func sortedKeys(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
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

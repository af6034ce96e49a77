package idemvet

import (
	"go/ast"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// Consumer reports Kafka consume loops (franz-go or segmentio/kafka-go) that
// write to a database without deduplicating the records.
var Consumer = &analysis.Analyzer{
	Name: "idemconsumer",
	Doc:  "report a function that polls a kgo.Client (or reads a kafka-go Reader) and writes to a database without idem's inbox",
	Run:  runConsumer,
}

const msgConsumer = "kafka consumer writes to the database without deduplication: apply records through inbox (or idemkafka.Consumer) so a redelivery is not applied twice"

func runConsumer(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	r := newReporter(pass)
	funcBodies(pass, func(body *ast.BlockStmt) {
		polls, dedup := false, false
		var execs []*ast.CallExpr
		ast.Inspect(body, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && usesDedupPackage(info, id) {
				dedup = true
			}
			// Any constant string: a literal, a named constant (of this
			// package or another), a constant concatenation.
			if e, ok := n.(ast.Expr); ok {
				if s, ok := constString(info, e); ok && dedupSQL(s) {
					dedup = true
				}
			}
			switch n := n.(type) {
			case *ast.CallExpr:
				fn := callee(info, n)
				switch {
				case isMethod(fn, kgoPath, "Client", "PollFetches", "PollRecords"),
					isMethod(fn, kafkagoPath, "Reader", "FetchMessage", "ReadMessage"):
					polls = true
				case dbHandle(fn) != notDB && contains(execNames, fn.Name()) && !isAdminSQL(info, n):
					execs = append(execs, n)
				}
			}
			return true
		})
		if !polls || dedup {
			return
		}
		for _, e := range execs {
			r.report(e, msgConsumer)
		}
	})
	return nil, nil
}

// usesDedupPackage reports whether id refers to package inbox or idemkafka
// or to something they declare.
func usesDedupPackage(info *types.Info, id *ast.Ident) bool {
	obj := info.Uses[id]
	if obj == nil {
		return false
	}
	var pkg *types.Package
	if pn, ok := obj.(*types.PkgName); ok {
		pkg = pn.Imported()
	} else {
		pkg = obj.Pkg()
	}
	return pkg != nil && (pkg.Path() == inboxPath || pkg.Path() == idemkafkaPath)
}

// dedupSQL reports whether q skips a row already there: INSERT ... ON
// CONFLICT DO NOTHING (PostgreSQL, SQLite) or INSERT OR IGNORE (SQLite).
func dedupSQL(q string) bool {
	u := strings.Join(strings.Fields(strings.ToUpper(q)), " ")
	return strings.Contains(u, "DO NOTHING") || strings.Contains(u, "INSERT OR IGNORE")
}

// adminWords start statements that set up or maintain the database rather
// than apply a record: a benchmark or test harness may run them beside a poll.
var adminWords = []string{"TRUNCATE", "CREATE", "DROP", "ALTER", "VACUUM", "ANALYZE", "CHECKPOINT", "SET", "RESET", "GRANT", "REVOKE", "COMMENT"}

// isAdminSQL reports whether the SQL argument of call starts (as a constant,
// or the constant head of a concatenation) with one of adminWords.
func isAdminSQL(info *types.Info, call *ast.CallExpr) bool {
	for _, a := range call.Args {
		e := ast.Unparen(a)
		for {
			b, ok := e.(*ast.BinaryExpr)
			if !ok || b.Op != token.ADD {
				break
			}
			e = ast.Unparen(b.X)
		}
		q, ok := constString(info, e)
		if !ok {
			continue
		}
		f := strings.Fields(q)
		return len(f) > 0 && contains(adminWords, strings.ToUpper(f[0]))
	}
	return false
}

package idemvet

import (
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// Analyzers returns every idemvet analyzer, one per rule.
func Analyzers() []*analysis.Analyzer {
	return []*analysis.Analyzer{
		Producer,
		RetryKey,
		RandomID,
		TxWrite,
		Consumer,
		FloatMoney,
		AutoCommit,
		CheckInsert,
		StaticID,
	}
}

// Import paths of the packages the rules know.
const (
	kgoPath        = "github.com/twmb/franz-go/pkg/kgo"
	kafkagoPath    = "github.com/segmentio/kafka-go"
	uuidPath       = "github.com/google/uuid"
	eventPath      = "github.com/idemkit/idem/event"
	idemclientPath = "github.com/idemkit/idem/idemclient"
	idemhttpPath   = "github.com/idemkit/idem/idemhttp"
	inboxPath      = "github.com/idemkit/idem/inbox"
	idemkafkaPath  = "github.com/idemkit/idem/idemkafka"
	pgxPath        = "github.com/jackc/pgx/v5"
	pgxpoolPath    = "github.com/jackc/pgx/v5/pgxpool"
	pgx4Path       = "github.com/jackc/pgx/v4"
	pgxpool4Path   = "github.com/jackc/pgx/v4/pgxpool"
	sqlPath        = "database/sql"
	httpPath       = "net/http"
	timePath       = "time"
)

// gofrsUUIDPaths are the import paths of github.com/gofrs/uuid, whose
// NewV4 makes a random UUID as google/uuid's New does.
var gofrsUUIDPaths = []string{"github.com/gofrs/uuid", "github.com/gofrs/uuid/v5"}

// callee returns the function or method call invokes, or nil (builtins,
// conversions, calls of function values). For an instance of a generic
// function or method it returns the generic one.
func callee(info *types.Info, call *ast.CallExpr) *types.Func {
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil {
		return nil
	}
	return fn.Origin()
}

// isFunc reports whether fn is one of the package-level functions names of
// the package with import path pkg.
func isFunc(fn *types.Func, pkg string, names ...string) bool {
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != pkg {
		return false
	}
	if fn.Type().(*types.Signature).Recv() != nil {
		return false
	}
	return contains(names, fn.Name())
}

// recvType returns the named type of fn's receiver, through one pointer,
// or nil when fn is not a method of a named type.
func recvType(fn *types.Func) *types.Named {
	if fn == nil {
		return nil
	}
	recv := fn.Type().(*types.Signature).Recv()
	if recv == nil {
		return nil
	}
	t := recv.Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, _ := types.Unalias(t).(*types.Named)
	return n
}

// isNamed reports whether n is the type pkg.name.
func isNamed(n *types.Named, pkg string, names ...string) bool {
	if n == nil {
		return false
	}
	obj := n.Origin().Obj()
	return obj.Pkg() != nil && obj.Pkg().Path() == pkg && contains(names, obj.Name())
}

// isMethod reports whether fn is one of the methods names of the type
// pkg.typ (or a pointer to it).
func isMethod(fn *types.Func, pkg, typ string, names ...string) bool {
	return isNamed(recvType(fn), pkg, typ) && contains(names, fn.Name())
}

// isType reports whether t is pkg.name or a pointer to it.
func isType(t types.Type, pkg, name string) bool {
	if p, ok := types.Unalias(t).(*types.Pointer); ok {
		t = p.Elem()
	}
	n, _ := types.Unalias(t).(*types.Named)
	return isNamed(n, pkg, name)
}

// isField reports whether v is the field name of the struct type pkg.typ
// (selected directly or promoted through an embedded field).
func isField(v *types.Var, pkg, typ, name string) bool {
	if v == nil || !v.IsField() || v.Name() != name || v.Pkg() == nil || v.Pkg().Path() != pkg {
		return false
	}
	tn, ok := v.Pkg().Scope().Lookup(typ).(*types.TypeName)
	if !ok {
		return false
	}
	st, ok := tn.Type().Underlying().(*types.Struct)
	if !ok {
		return false
	}
	for f := range st.Fields() {
		if f == v.Origin() {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// dbKind classifies the receiver of a database method.
type dbKind int

const (
	notDB  dbKind = iota
	dbPool        // a pool or connection: statements run outside any transaction
	dbTx          // a transaction
)

// dbHandle classifies the type whose method fn is: a pgx or pgxpool (v5 or
// v4) pool, connection or transaction, or a database/sql DB, Conn, Tx or
// Stmt.
func dbHandle(fn *types.Func) dbKind {
	n := recvType(fn)
	switch {
	case isNamed(n, pgxpoolPath, "Pool", "Conn"), isNamed(n, pgxPath, "Conn"),
		isNamed(n, pgxpool4Path, "Pool", "Conn"), isNamed(n, pgx4Path, "Conn"),
		isNamed(n, sqlPath, "DB", "Conn"):
		return dbPool
	case isNamed(n, pgxpoolPath, "Tx"), isNamed(n, pgxPath, "Tx"),
		isNamed(n, pgxpool4Path, "Tx"), isNamed(n, pgx4Path, "Tx"),
		isNamed(n, sqlPath, "Tx", "Stmt"):
		return dbTx
	}
	return notDB
}

// execNames are the methods that run a statement that may write.
var execNames = []string{"Exec", "ExecContext"}

// sqlNames are the methods that run a statement with arguments.
var sqlNames = []string{"Exec", "ExecContext", "Query", "QueryContext", "QueryRow", "QueryRowContext"}

// constString returns the value of e when it is a constant string.
func constString(info *types.Info, e ast.Expr) (string, bool) {
	tv, ok := info.Types[e]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.String {
		return "", false
	}
	return constant.StringVal(tv.Value), true
}

// sqlArg returns the constant SQL text of a database call, if any: the
// argument of the method's first string parameter (the query; a Stmt's
// methods have none), a constant or a variable (not a parameter, whose
// value may be the caller's) assigned one constant once (query := "SELECT ..."). A variable assigned more than once (q +=
// " FOR UPDATE") has no constant text.
func sqlArg(info *types.Info, assigns map[types.Object][]assignment, call *ast.CallExpr) (string, bool) {
	sig, ok := info.TypeOf(call.Fun).(*types.Signature)
	if !ok {
		return "", false
	}
	for i := range sig.Params().Len() {
		if i == sig.Params().Len()-1 && sig.Variadic() {
			break
		}
		b, ok := sig.Params().At(i).Type().(*types.Basic)
		if !ok || b.Kind() != types.String {
			continue
		}
		if i >= len(call.Args) {
			return "", false
		}
		a := ast.Unparen(call.Args[i])
		if s, ok := constString(info, a); ok {
			return s, true
		}
		if id, ok := a.(*ast.Ident); ok {
			if v, ok := info.Uses[id].(*types.Var); ok && !isParam(v) && len(assigns[v]) == 1 && assigns[v][0].Index == 0 {
				return constString(info, assigns[v][0].Expr)
			}
		}
		return "", false
	}
	return "", false
}

// isReadOnlySQL reports whether q is a statement that does not write: one
// that starts, after comments, parentheses and white space, with SELECT,
// SHOW, VALUES or TABLE and has no locking clause (FOR UPDATE, FOR NO KEY
// UPDATE, FOR SHARE, FOR KEY SHARE), with WITH and has neither a locking
// clause nor INSERT, UPDATE, DELETE or MERGE (a data-modifying CTE), or
// with EXPLAIN without ANALYZE (EXPLAIN ANALYZE runs the statement, judged
// as WITH is).
func isReadOnlySQL(q string) bool {
	words := sqlWords(q)
	if len(words) == 0 {
		return false
	}
	locks, modifies := false, false
	for i, w := range words {
		switch w {
		case "INSERT", "UPDATE", "DELETE", "MERGE":
			modifies = true
		case "FOR":
			if i+1 < len(words) && contains(lockStrengths, words[i+1]) {
				locks = true
			}
		}
	}
	switch words[0] {
	case "SELECT", "SHOW", "VALUES", "TABLE":
		return !locks
	case "EXPLAIN":
		if !contains(words, "ANALYZE") && !contains(words, "ANALYSE") {
			return true // planned, not run
		}
		return !locks && !modifies
	case "WITH":
		return !locks && !modifies
	}
	return false
}

// lockStrengths are the words that follow FOR in a locking clause: FOR
// UPDATE, FOR NO KEY UPDATE, FOR SHARE, FOR KEY SHARE.
var lockStrengths = []string{"UPDATE", "NO", "SHARE", "KEY"}

// sqlWords returns the words (keywords, names, numbers) of the SQL text q
// in upper case, skipping comments (-- to the end of the line, and /* */,
// nested as in PostgreSQL), quoted strings and names, and punctuation.
func sqlWords(q string) []string {
	var words []string
	for _, t := range sqlTokens(q) {
		if t.kind == sqlWord {
			words = append(words, t.text)
		}
	}
	return words
}

// sqlTokenKind says what a sqlToken is.
type sqlTokenKind int

const (
	sqlWord  sqlTokenKind = iota // a keyword, name or number, in upper case
	sqlName                      // a quoted name ("x" or `x`), without its quotes
	sqlPunct                     // one byte of punctuation: . , ( ) ...
)

// sqlToken is one token of SQL text.
type sqlToken struct {
	kind sqlTokenKind
	text string
}

// sqlTokens splits the SQL text q into words, quoted names and
// punctuation, skipping white space, comments (-- to the end of the line,
// and /* */, nested as in PostgreSQL) and quoted strings.
func sqlTokens(q string) []sqlToken {
	var toks []sqlToken
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case strings.HasPrefix(q[i:], "--"):
			if j := strings.IndexByte(q[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(q)
			}
		case strings.HasPrefix(q[i:], "/*"):
			for depth := 0; i < len(q); {
				if strings.HasPrefix(q[i:], "/*") {
					depth++
					i += 2
				} else if strings.HasPrefix(q[i:], "*/") {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
		case c == '\'' || c == '"' || c == '`':
			j := strings.IndexByte(q[i+1:], c)
			if j < 0 {
				j = len(q) - i - 1
			}
			if c != '\'' {
				toks = append(toks, sqlToken{sqlName, q[i+1 : i+1+j]})
			}
			i += j + 2
		case isSQLWordByte(c):
			j := i
			for j < len(q) && isSQLWordByte(q[j]) {
				j++
			}
			toks = append(toks, sqlToken{sqlWord, strings.ToUpper(q[i:j])})
			i = j
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		default:
			toks = append(toks, sqlToken{sqlPunct, q[i : i+1]})
			i++
		}
	}
	return toks
}

func isSQLWordByte(c byte) bool {
	return c == '_' || c >= 0x80 || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// assignment is one value assigned to a variable: Expr, or result Index of
// the call Expr when the assignment spreads a call over several variables.
type assignment struct {
	Expr  ast.Expr
	Index int
}

// assignments maps every variable of the package to the values assigned to
// it by =, :=, and var declarations.
func assignments(pass *analysis.Pass) map[types.Object][]assignment {
	m := make(map[types.Object][]assignment)
	add := func(lhs []ast.Expr, rhs []ast.Expr) {
		for i, l := range lhs {
			id, ok := ast.Unparen(l).(*ast.Ident)
			if !ok || id.Name == "_" {
				continue
			}
			obj := pass.TypesInfo.ObjectOf(id)
			if obj == nil {
				continue
			}
			switch {
			case len(lhs) == len(rhs):
				m[obj] = append(m[obj], assignment{rhs[i], 0})
			case len(rhs) == 1:
				m[obj] = append(m[obj], assignment{rhs[0], i})
			}
		}
	}
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				add(n.Lhs, n.Rhs)
			case *ast.ValueSpec:
				lhs := make([]ast.Expr, len(n.Names))
				for i, id := range n.Names {
					lhs[i] = id
				}
				add(lhs, n.Values)
			}
			return true
		})
	}
	return m
}

// funcBodies calls fn for every top-level function body of the files,
// function literals inside it included, skipping generated files.
func funcBodies(pass *analysis.Pass, fn func(body *ast.BlockStmt)) {
	for _, f := range sourceFiles(pass) {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Body != nil {
					fn(d.Body)
				}
			case *ast.GenDecl:
				ast.Inspect(d, func(n ast.Node) bool {
					if lit, ok := n.(*ast.FuncLit); ok {
						fn(lit.Body)
						return false
					}
					return true
				})
			}
		}
	}
}

// reporter reports each position at most once, except where an
// //idemvet:ignore comment naming the rule silences it (see ignore.go).
// Every analyzer reports through one.
type reporter struct {
	pass        *analysis.Pass
	seen        map[ast.Node]bool
	ignoreIndex map[lineKey][]ignoreDirective // built on the first report
}

func newReporter(pass *analysis.Pass) *reporter {
	return &reporter{pass: pass, seen: make(map[ast.Node]bool)}
}

func (r *reporter) report(n ast.Node, msg string) {
	if r.seen[n] {
		return
	}
	r.seen[n] = true
	if r.ignored(n.Pos()) {
		return
	}
	r.pass.Report(analysis.Diagnostic{Pos: n.Pos(), End: n.End(), Message: msg})
}

// sourceFiles returns the files of the package that are not generated.
func sourceFiles(pass *analysis.Pass) []*ast.File {
	var out []*ast.File
	for _, f := range pass.Files {
		if !isGenerated(pass.Fset, f) {
			out = append(out, f)
		}
	}
	return out
}

// isTestFile reports whether f is a _test.go file. The rules about what a
// deployed service does (idemproducer, idemautocommit, idemrandomid,
// idemstaticid) skip them: a test's Kafka clients write test records and
// commit test offsets, often to a fake broker and with a setting the test
// is about.
func isTestFile(pass *analysis.Pass, f *ast.File) bool {
	return strings.HasSuffix(pass.Fset.File(f.Pos()).Name(), "_test.go")
}

// cgoGenerator is what cmd/cgo writes in "// Code generated ... DO NOT
// EDIT." at the top of its files.
const cgoGenerator = "by cmd/cgo;"

// isGenerated reports whether f is a generated file, which the rules skip:
// a "// Code generated ... DO NOT EDIT." line before the package clause.
// cmd/cgo's copy of a source file that imports "C" (what go vet and
// go/packages hand an analyzer in place of the file) is not generated: it
// starts with cmd/cgo's line and a //line directive naming the original
// file, and is checked unless the original has a generated line of its
// own. cmd/cgo's own files (_cgo_gotypes.go, ...) have no //line directive
// before the package clause and are generated.
func isGenerated(fset *token.FileSet, f *ast.File) bool {
	cgo := false
	for _, g := range f.Comments {
		if g.Pos() > f.Package {
			break
		}
		for _, c := range g.List {
			if c.Pos() > f.Package {
				break
			}
			for line := range strings.SplitSeq(c.Text, "\n") {
				rest, ok := strings.CutPrefix(line, "// Code generated ")
				if !ok {
					continue
				}
				gen, ok := strings.CutSuffix(rest, " DO NOT EDIT.")
				switch {
				case !ok:
				case gen == cgoGenerator:
					cgo = true
				default:
					return true
				}
			}
		}
	}
	if !cgo {
		return false
	}
	pkg := fset.Position(f.Package)
	return pkg.Filename == fset.PositionFor(f.Package, false).Filename
}

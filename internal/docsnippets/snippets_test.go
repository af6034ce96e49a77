package docsnippets_test

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/scanner"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/tools/go/packages"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// importPaths are the packages a snippet may use without importing them:
// a snippet's selector X.Name whose X it does not declare gets the import
// of X from here. A package missing from this table leaves its uses
// unchecked (see undefinedName), never a failure.
var importPaths = map[string]string{
	"bytes":        "bytes",
	"context":      "context",
	"errors":       "errors",
	"filepath":     "path/filepath",
	"fmt":          "fmt",
	"http":         "net/http",
	"log":          "log",
	"os":           "os",
	"sql":          "database/sql",
	"strconv":      "strconv",
	"testing":      "testing",
	"time":         "time",
	"pgx":          "github.com/jackc/pgx/v5",
	"pgxpool":      "github.com/jackc/pgx/v5/pgxpool",
	"kgo":          "github.com/twmb/franz-go/pkg/kgo",
	"kfake":        "github.com/twmb/franz-go/pkg/kfake",
	"kadm":         "github.com/twmb/franz-go/pkg/kadm",
	"kerr":         "github.com/twmb/franz-go/pkg/kerr",
	"kmsg":         "github.com/twmb/franz-go/pkg/kmsg",
	"cleanup":      "github.com/idemkit/idem/cleanup",
	"driver":       "github.com/idemkit/idem/driver",
	"drivertest":   "github.com/idemkit/idem/driver/drivertest",
	"pgdriver":     "github.com/idemkit/idem/driver/pgdriver",
	"pgsqldriver":  "github.com/idemkit/idem/driver/pgsqldriver",
	"sqlitedriver": "github.com/idemkit/idem/driver/sqlitedriver",
	"event":        "github.com/idemkit/idem/event",
	"idemclient":   "github.com/idemkit/idem/idemclient",
	"idemhttp":     "github.com/idemkit/idem/idemhttp",
	"idemkafka":    "github.com/idemkit/idem/idemkafka",
	"inbox":        "github.com/idemkit/idem/inbox",
	"observe":      "github.com/idemkit/idem/observe",
	"outbox":       "github.com/idemkit/idem/outbox",
	"problem":      "github.com/idemkit/idem/problem",
	"saga":         "github.com/idemkit/idem/saga",
	"uniq":         "github.com/idemkit/idem/uniq",
}

// defaultPrelude declares what the snippets take as given (the README's
// "ctx", "drv", "tx", the application's own functions), at package level,
// where a snippet's own declarations shadow them. The README's snippets
// use PostgreSQL through pgdriver, so tx is a pgx.Tx.
const defaultPrelude = `
var (
	ctx           context.Context
	dsn           string
	pool          *pgxpool.Pool
	drv           *pgdriver.Driver
	tx            pgx.Tx
	mux           *http.ServeMux
	r, req        *http.Request
	w             http.ResponseWriter
	seeds         []string
	orderID       string
	order         any
	reservation   any
	e, env        event.Envelope
	ib            *inbox.Inbox[pgx.Tx]
	sagas         *saga.Coordinator[pgx.Tx]
	cfg           *idemkafka.ConsumerConfig[pgx.Tx]
	createPayment http.Handler
	auth          struct {
		ClientID func(context.Context) (string, error)
	}

	c             *idemclient.Client
	url           string
	body          []byte
	db            interface{ Insert(op any) error }

	charge       func(ctx context.Context, tx pgx.Tx, orderID string) (paymentID string, err error)
	refund       func(ctx context.Context, tx pgx.Tx, paymentID string) error
	notify       saga.StepFunc[pgx.Tx]
	reserveStock func(ctx context.Context, tx pgx.Tx, order any) (reservationID string, err error)
	releaseStock func(ctx context.Context, tx pgx.Tx, reservationID string) error
)

type (
	payment    struct{ ID int64 }
	Payment    struct{ IdemKey string }
	StepRecord = saga.StepRecord
)

var newMigratedDriver, newUnmigratedDriver func(*testing.T) driver.Driver[pgx.Tx]
`

// preludes are the preludes of the documents whose snippets take other
// things as given.
var preludes = map[string]string{
	"docs/idemvet.md": `
var (
	ctx context.Context
	tx  *sql.Tx
	s   struct{ pool *pgxpool.Pool }
	l   struct{ Price float64 }
)
`,
	"docs/design/kafka-notes.md": `
var (
	c  *kfake.Cluster
	cl *kgo.Client

	errIdempotenceDisabled, errAcks, errCancellable error
)
`,
}

// A snippet is one Go block of the documentation.
type snippet struct {
	file string // relative to root, slash-separated
	line int    // of the block's first line
	text string
	// mayBeText: a block of a package documentation, which is Go only if
	// it parses as Go and uses idem's packages (others are tables, SQL,
	// shell). A ```go block must be Go.
	mayBeText bool
}

func (s snippet) String() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

// TestSnippets type-checks every Go snippet of the documentation against
// the module's packages. Elisions ("{ ... }", "f(x, ...)", a line "...")
// are removed first, a fragment of statements becomes a function's body,
// and the names a snippet takes as given come from a prelude. A name
// nothing declares (a helper of the snippet's, a package outside this
// module such as idemotel) is logged and its uses go unchecked, unless
// the snippet assigns to it with "=" (an "err = ..." whose "err :=" is
// missing): what fails is what the module's API says about a snippet.
func TestSnippets(t *testing.T) {
	start := time.Now()
	snippets := append(markdownSnippets(t), packageDocSnippets(t)...)
	imp := loadImporter(t, snippetImports(snippets))
	loaded := time.Since(start)
	checked := 0
	for _, s := range snippets {
		if checkSnippet(t, s, imp) {
			checked++
			if testing.Verbose() {
				t.Logf("checked %s", s)
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d snippets checked: the extraction is broken", checked)
	}
	t.Logf("%d snippets checked (%d found): packages loaded in %v, checked in %v", checked, len(snippets),
		loaded.Round(time.Millisecond), (time.Since(start) - loaded).Round(time.Millisecond))
}

// markdownSnippets returns the ```go blocks of README.md, docs/*.md and
// docs/design/*.md (a fence may be indented, in a list).
func markdownSnippets(t *testing.T) []snippet {
	files := []string{"README.md"}
	for _, pat := range []string{"docs/*.md", "docs/design/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			files = append(files, filepath.ToSlash(rel))
		}
	}
	var out []snippet
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		for i := 0; i < len(lines); i++ {
			trimmed := strings.TrimLeft(lines[i], " ")
			if strings.TrimSpace(trimmed) != "```go" {
				continue
			}
			indent := len(lines[i]) - len(trimmed)
			var b strings.Builder
			j := i + 1
			for ; j < len(lines) && strings.TrimSpace(lines[j]) != "```"; j++ {
				l := lines[j]
				l = l[min(indent, len(l)-len(strings.TrimLeft(l, " "))):]
				b.WriteString(l)
				b.WriteByte('\n')
			}
			if j == len(lines) {
				t.Errorf("%s:%d: ```go block not closed", f, i+1)
			}
			out = append(out, snippet{file: f, line: i + 2, text: b.String()})
			i = j
		}
	}
	return out
}

// packageDocSnippets returns the code blocks of the library's package
// documentation (the doc.go files outside internal/, bench/ and cmd/).
func packageDocSnippets(t *testing.T) []snippet {
	var files []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" ||
				rel == "internal" || rel == "bench" || rel == "cmd") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() == "doc.go" {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []snippet
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		af, err := parser.ParseFile(fset, f, src, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		if af.Doc == nil {
			continue
		}
		var p comment.Parser
		d := p.Parse(af.Doc.Text())
		lines := strings.Split(string(src), "\n")
		for _, block := range d.Content {
			code, ok := block.(*comment.Code)
			if !ok {
				continue
			}
			first, _, _ := strings.Cut(code.Text, "\n")
			line := slices.IndexFunc(lines, func(l string) bool {
				return strings.HasPrefix(l, "//") && strings.TrimSpace(strings.TrimPrefix(l, "//")) == strings.TrimSpace(first)
			}) + 1
			out = append(out, snippet{file: f, line: line, text: code.Text, mayBeText: true})
		}
	}
	return out
}

// snippetImports returns the packages the snippets import themselves.
func snippetImports(snippets []snippet) []string {
	var paths []string
	for _, s := range snippets {
		src, err := wrap(s)
		if err != nil {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), "", src, parser.ImportsOnly)
		if err != nil {
			continue
		}
		for _, is := range f.Imports {
			paths = append(paths, strings.Trim(is.Path.Value, `"`))
		}
	}
	return paths
}

// loadImporter loads the packages of importPaths and extra (types from
// export data) and returns an importer over them and their dependencies.
func loadImporter(t *testing.T, extra []string) types.Importer {
	paths := extra
	for _, p := range importPaths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	paths = slices.Compact(paths)
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedTypes,
		Dir:  root,
	}
	pkgs, err := packages.Load(cfg, paths...)
	if err != nil {
		t.Fatal(err)
	}
	// The packages' types come from their export data, which holds what
	// they use of their dependencies: the dependencies are not loaded
	// (with them, under -race, loading took minutes).
	byPath := map[string]*types.Package{}
	var add func(p *types.Package)
	add = func(p *types.Package) {
		if byPath[p.Path()] != nil {
			return
		}
		byPath[p.Path()] = p
		for _, i := range p.Imports() {
			add(i)
		}
	}
	for _, p := range pkgs {
		for _, e := range p.Errors {
			t.Errorf("loading %s: %v", p.PkgPath, e)
		}
		if p.Types != nil {
			add(p.Types)
		}
	}
	return importerFunc(func(path string) (*types.Package, error) {
		if p, ok := byPath[path]; ok {
			return p, nil
		}
		return nil, fmt.Errorf("package %s is not in importPaths", path)
	})
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// checkSnippet type-checks s and reports its errors; it returns false for
// a package documentation block that is not Go.
func checkSnippet(t *testing.T, s snippet, imp types.Importer) bool {
	t.Helper()
	fset := token.NewFileSet()
	src, err := wrap(s)
	var f *ast.File
	if err == nil {
		f, err = parser.ParseFile(fset, "snippet.go", src, parser.ParseComments)
	}
	if err != nil {
		// A block of a package documentation that does not parse is text
		// (a table, SQL, JSON), unless it declares a variable.
		if !s.mayBeText || strings.Contains(s.text, ":=") {
			t.Errorf("%s: the Go block does not parse: %v", s, err)
		}
		return false
	}
	if s.mayBeText && !usesIdem(f) {
		return false
	}
	src = addImports(fset, f, src)
	f, err = parser.ParseFile(fset, "snippet.go", src, parser.ParseComments)
	if err != nil {
		t.Errorf("%s: after adding imports: %v\n%s", s, err, src)
		return false
	}
	pre, ok := preludes[s.file]
	if !ok {
		pre = defaultPrelude
	}
	pf := preludeFile(t, fset, f.Name.Name, pre, f)
	var unchecked []string
	var failed bool
	conf := types.Config{
		Importer: imp,
		Error: func(err error) {
			var te types.Error
			if !errors.As(err, &te) {
				t.Errorf("%s: %v", s, err)
				failed = true
				return
			}
			if te.Soft && softIgnored(te.Msg) {
				return // unused variables and imports: a snippet shows a call, not a program
			}
			if name, ok := undefinedName(te.Msg); ok && !assignedTo(f, te.Pos) {
				unchecked = append(unchecked, name)
				return
			}
			failed = true
			t.Errorf("%s: %v", te.Fset.Position(te.Pos), te.Msg)
		},
	}
	_, _ = conf.Check(f.Name.Name, fset, []*ast.File{pf, f}, nil)
	if failed {
		t.Logf("%s, as checked:\n%s", s, src)
	}
	if len(unchecked) > 0 {
		t.Logf("%s: not declared anywhere, its uses unchecked: %s", s, strings.Join(unchecked, ", "))
	}
	return true
}

// softIgnored tells the soft errors a snippet may have.
func softIgnored(msg string) bool {
	return strings.Contains(msg, "declared and not used") || strings.Contains(msg, "imported and not used")
}

// undefinedName returns the name of an "undefined: x" error about a bare
// identifier (a helper the snippet takes as given). An undefined selector
// of a package ("undefined: idemhttp.Nwe") is a real error.
func undefinedName(msg string) (string, bool) {
	name, ok := strings.CutPrefix(msg, "undefined: ")
	if !ok || strings.Contains(name, ".") {
		return "", false
	}
	return name, true
}

// assignedTo tells whether the identifier at pos is assigned to with "=":
// a variable the snippet was meant to declare itself (err = ... after no
// err :=), not one it takes as given.
func assignedTo(f *ast.File, pos token.Pos) bool {
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		if a, ok := n.(*ast.AssignStmt); ok && a.Tok == token.ASSIGN {
			for _, l := range a.Lhs {
				if id, ok := l.(*ast.Ident); ok && id.Pos() == pos {
					found = true
				}
			}
		}
		return !found
	})
	return found
}

// usesIdem tells whether f selects from one of idem's packages.
func usesIdem(f *ast.File) bool {
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if x, ok := sel.X.(*ast.Ident); ok && strings.HasPrefix(importPaths[x.Name], "github.com/idemkit/idem/") {
				found = true
			}
		}
		return !found
	})
	return found
}

// wrap makes s a Go file whose lines after a //line directive are the
// snippet's, at their place in the document: as it is when it has a
// package clause, after one when it is declarations, in a "var _ =" when
// it is one expression, else as the body of a function (after the
// snippet's own imports), whose results follow its top-level returns.
func wrap(s snippet) (string, error) {
	text := elide(s.text)
	at := func(line int) string { return fmt.Sprintf("//line %s:%d\n", s.file, line) }
	if hasPackageClause(text) {
		return at(s.line) + text, nil
	}
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package snippet\n"+text, 0); err == nil {
		return "package snippet\n" + at(s.line) + text, nil
	}
	if x, err := parser.ParseExpr(text); err == nil {
		if _, call := x.(*ast.CallExpr); !call {
			return "package snippet\nvar _ =\n" + at(s.line) + text, nil
		}
	}
	imports, body, n := splitImports(text)
	file := func(results int) string {
		sig, ret := "", ""
		if results > 0 {
			sig = "(" + strings.Repeat("any, ", results-1) + "error)"
			ret = "\nreturn " + strings.TrimSuffix(strings.Repeat("nil, ", results), ", ")
		}
		return "package snippet\n" + at(s.line) + imports + "func _() " + sig + " {\n" + at(s.line+n) + body + ret + "\n}\n"
	}
	f, err := parser.ParseFile(token.NewFileSet(), "", file(0), 0)
	if err != nil {
		return "", err
	}
	results := 0
	fn := f.Decls[len(f.Decls)-1].(*ast.FuncDecl)
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			results = max(results, len(n.Results))
		}
		return true
	})
	return file(results), nil
}

func hasPackageClause(text string) bool {
	var s scanner.Scanner
	fset := token.NewFileSet()
	s.Init(fset.AddFile("", -1, len(text)), []byte(text), nil, 0)
	_, tok, _ := s.Scan()
	return tok == token.PACKAGE
}

// splitImports splits the leading import declarations of a fragment of
// statements from the rest, and returns how many lines they took.
func splitImports(text string) (imports, rest string, lines int) {
	sc := bufio.NewScanner(strings.NewReader(text))
	var imp, body strings.Builder
	inBlock, done := false, false
	for sc.Scan() {
		l := sc.Text()
		switch {
		case done:
			body.WriteString(l + "\n")
			continue
		case inBlock:
			inBlock = strings.TrimSpace(l) != ")"
		case strings.HasPrefix(l, "import ("):
			inBlock = true
		case strings.HasPrefix(l, "import ") || strings.TrimSpace(l) == "":
		default:
			done = true
			body.WriteString(l + "\n")
			continue
		}
		imp.WriteString(l + "\n")
		lines++
	}
	return imp.String(), body.String(), lines
}

// elide removes the documentation's elisions, keeping every line where it
// is: "{ ... }" and "f(...)", a trailing ", ..." in a call or a literal,
// "Field: ...," in a literal, and a line that is only "...". An ellipsis
// after an operand ("f(xs...)", "[...]T") is Go and stays.
func elide(text string) string {
	type tk struct {
		tok        token.Token
		start, end int
		line       int
	}
	var s scanner.Scanner
	fset := token.NewFileSet()
	file := fset.AddFile("", -1, len(text))
	s.Init(file, []byte(text), func(token.Position, string) {}, 0)
	var toks []tk
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.SEMICOLON && lit == "\n" {
			continue // inserted at a line's end
		}
		off := file.Offset(pos)
		n := len(lit)
		if n == 0 {
			n = len(tok.String())
		}
		toks = append(toks, tk{tok, off, off + n, file.Line(pos)})
	}
	out := []byte(text)
	blank := func(from, to int) {
		for i := from; i < to; i++ {
			if out[i] != '\n' {
				out[i] = ' '
			}
		}
	}
	tokAt := func(i int) tk {
		if i < 0 || i >= len(toks) {
			return tk{tok: token.ILLEGAL, line: -1}
		}
		return toks[i]
	}
	for i, k := range toks {
		if k.tok != token.ELLIPSIS {
			continue
		}
		prev, next := tokAt(i-1), tokAt(i+1)
		closing := next.tok == token.RPAREN || next.tok == token.RBRACE
		switch {
		case (prev.tok == token.LPAREN || prev.tok == token.LBRACE) && closing:
			blank(k.start, k.end)
		case prev.tok == token.COMMA && closing:
			blank(prev.start, k.end)
		case prev.tok == token.COLON && tokAt(i-2).tok == token.IDENT:
			end := k.end
			if next.tok == token.COMMA {
				end = next.end
			}
			blank(tokAt(i-2).start, end)
		case prev.line != k.line && next.line != k.line:
			blank(k.start, k.end)
		}
	}
	return string(out)
}

// addImports adds to f's source, on its package clause's line (so that no
// line moves), the imports of importPaths that f uses and does not have.
func addImports(fset *token.FileSet, f *ast.File, src string) string {
	have := map[string]bool{}
	for _, is := range f.Imports {
		name := ""
		if is.Name != nil {
			name = is.Name.Name
		} else {
			p := strings.Trim(is.Path.Value, `"`)
			name = p[strings.LastIndex(p, "/")+1:]
			if name == "v5" {
				name = "pgx"
			}
		}
		have[name] = true
	}
	unresolved := map[string]bool{}
	for _, id := range f.Unresolved {
		unresolved[id.Name] = true
	}
	need := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if x, ok := sel.X.(*ast.Ident); ok && unresolved[x.Name] && !have[x.Name] && importPaths[x.Name] != "" {
				need[x.Name] = true
			}
		}
		return true
	})
	if len(need) == 0 {
		return src
	}
	var names []string
	for n := range need {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("; import (")
	for _, n := range names {
		fmt.Fprintf(&b, "%s %q; ", n, importPaths[n])
	}
	b.WriteString(")")
	end := fset.File(f.Name.End()).Offset(f.Name.End())
	return src[:end] + b.String() + src[end:]
}

// preludeFile parses the prelude, with the imports it uses, less the
// declarations of the names the snippet declares at package level.
func preludeFile(t *testing.T, fset *token.FileSet, pkg, pre string, snippet *ast.File) *ast.File {
	t.Helper()
	declared := map[string]bool{}
	for _, d := range snippet.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				declared[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, sp := range d.Specs {
				switch sp := sp.(type) {
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						declared[n.Name] = true
					}
				case *ast.TypeSpec:
					declared[sp.Name.Name] = true
				}
			}
		}
	}
	src := "package " + pkg + "\n" + pre
	pfset := token.NewFileSet()
	f, err := parser.ParseFile(pfset, "prelude.go", src, 0)
	if err != nil {
		t.Fatalf("prelude: %v", err)
	}
	src = addImports(pfset, f, src)
	f, err = parser.ParseFile(fset, "prelude.go", src, 0)
	if err != nil {
		t.Fatalf("prelude: %v", err)
	}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok == token.IMPORT {
			continue
		}
		g.Specs = slices.DeleteFunc(g.Specs, func(sp ast.Spec) bool {
			switch sp := sp.(type) {
			case *ast.ValueSpec:
				sp.Names = slices.DeleteFunc(sp.Names, func(n *ast.Ident) bool { return declared[n.Name] })
				return len(sp.Names) == 0
			case *ast.TypeSpec:
				return declared[sp.Name.Name]
			}
			return false
		})
	}
	return f
}

package idemvet

import (
	"go/ast"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// RandomID reports event IDs taken from a random (version 4) UUID.
var RandomID = &analysis.Analyzer{
	Name: "idemrandomid",
	Doc:  "report a random UUIDv4 used as an event ID (event.Envelope.ID or an EventID field)",
	Run:  runRandomID,
}

const msgRandomID = "event ID from a random UUIDv4: use event.NewID() once per operation (UUIDv7) or a derived ID"

func runRandomID(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	assigns := assignments(pass)
	r := newReporter(pass)
	check := func(field *types.Var, value ast.Expr) {
		if field != nil && isEventIDField(field) && isRandomUUID(pass, assigns, value, 0, 0) {
			r.report(value, msgRandomID)
		}
	}
	for _, f := range sourceFiles(pass) {
		if isTestFile(pass, f) {
			continue // fixtures, and tests that a v4 ID is rejected
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				st := structOf(info.TypeOf(n))
				for i, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						// An unkeyed struct literal: element i is field i.
						if st != nil && i < st.NumFields() {
							check(st.Field(i), el)
						}
						continue
					}
					key, ok := kv.Key.(*ast.Ident)
					if !ok {
						continue
					}
					field, _ := info.ObjectOf(key).(*types.Var)
					if field != nil && field.IsField() {
						check(field, kv.Value)
					}
				}
			case *ast.AssignStmt:
				for i, lhs := range n.Lhs {
					sel, ok := ast.Unparen(lhs).(*ast.SelectorExpr)
					if !ok {
						continue
					}
					s, ok := info.Selections[sel]
					if !ok || s.Kind() != types.FieldVal {
						continue
					}
					field, _ := s.Obj().(*types.Var)
					switch {
					case len(n.Lhs) == len(n.Rhs):
						check(field, n.Rhs[i])
					case i == 0 && len(n.Rhs) == 1:
						// ev.ID, err = uuid.NewRandom()
						check(field, n.Rhs[0])
					}
				}
			}
			return true
		})
	}
	return nil, nil
}

// structOf returns the struct type t is, or points to, or nil.
func structOf(t types.Type) *types.Struct {
	if t == nil {
		return nil
	}
	if p, ok := t.Underlying().(*types.Pointer); ok {
		t = p.Elem()
	}
	st, _ := t.Underlying().(*types.Struct)
	return st
}

// isEventIDField reports whether field holds an event ID: the ID field
// of event.Envelope (also promoted through an embedded Envelope), or a
// uuid.UUID (google's or gofrs') or string field named EventID.
func isEventIDField(field *types.Var) bool {
	if isField(field, eventPath, "Envelope", "ID") {
		return true
	}
	if !strings.EqualFold(field.Name(), "EventID") {
		return false
	}
	t := field.Type()
	if isType(t, uuidPath, "UUID") {
		return true
	}
	for _, p := range gofrsUUIDPaths {
		if isType(t, p, "UUID") {
			return true
		}
	}
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Kind() == types.String
}

// isRandomUUID reports whether e is a random UUID: a call of uuid.New,
// NewRandom or NewString (github.com/gofrs/uuid: NewV4), possibly wrapped
// in uuid.Must or followed by
// .String(), a variable assigned one, or a call of a function of the
// package that returns one. index is the result of e wanted when e is a
// call; depth bounds the search through variables and functions.
func isRandomUUID(pass *analysis.Pass, assigns map[types.Object][]assignment, e ast.Expr, index, depth int) bool {
	if depth > 8 {
		return false
	}
	info := pass.TypesInfo
	switch e := ast.Unparen(e).(type) {
	case *ast.CallExpr:
		fn := callee(info, e)
		if decl := funcDecl(pass, fn); decl != nil {
			return returnsRandomUUID(pass, assigns, decl, index, depth+1)
		}
		if index != 0 {
			return false
		}
		switch {
		case isFunc(fn, uuidPath, "New", "NewRandom", "NewString", "NewRandomFromReader"),
			isFuncIn(fn, gofrsUUIDPaths, "NewV4"):
			return true
		case isFunc(fn, uuidPath, "Must") && len(e.Args) == 1,
			isFuncIn(fn, gofrsUUIDPaths, "Must") && len(e.Args) == 1,
			isMethod(fn, uuidPath, "UUID", "String", "URN"),
			isMethodIn(fn, gofrsUUIDPaths, "UUID", "String"):
			var inner ast.Expr
			if len(e.Args) == 1 {
				inner = e.Args[0]
			} else if sel, ok := ast.Unparen(e.Fun).(*ast.SelectorExpr); ok {
				inner = sel.X
			}
			return inner != nil && isRandomUUID(pass, assigns, inner, 0, depth+1)
		}
	case *ast.Ident:
		obj, ok := info.ObjectOf(e).(*types.Var)
		if !ok {
			return false
		}
		for _, a := range assigns[obj] {
			if isRandomUUID(pass, assigns, a.Expr, a.Index, depth+1) {
				return true
			}
		}
	}
	return false
}

// returnsRandomUUID reports whether the function decl returns a random
// UUID as its result index from one of its return statements.
func returnsRandomUUID(pass *analysis.Pass, assigns map[types.Object][]assignment, decl *ast.FuncDecl, index, depth int) bool {
	found := false
	ast.Inspect(decl.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false // its returns are its own
		case *ast.ReturnStmt:
			switch {
			case len(n.Results) == 1 && index > 0:
				// return f(), spread over the results
				found = found || isRandomUUID(pass, assigns, n.Results[0], index, depth)
			case index < len(n.Results):
				found = found || isRandomUUID(pass, assigns, n.Results[index], 0, depth)
			}
		}
		return !found
	})
	return found
}

// isMethodIn reports whether fn is one of the methods names of the type
// typ of one of the packages paths.
func isMethodIn(fn *types.Func, paths []string, typ string, names ...string) bool {
	for _, p := range paths {
		if isMethod(fn, p, typ, names...) {
			return true
		}
	}
	return false
}

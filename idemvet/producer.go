package idemvet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// Producer reports franz-go clients built without idempotent writes.
var Producer = &analysis.Analyzer{
	Name: "idemproducer",
	Doc:  "report kgo.NewClient with DisableIdempotentWrite or acks below all in-sync replicas",
	Run:  runProducer,
}

const (
	msgNoIdempotence = "kafka producer with idempotent writes disabled: remove DisableIdempotentWrite; duplicates on retry otherwise (use acks=all, the default)"
	msgLowAcks       = "kafka producer with acks below all: remove RequiredAcks(LeaderAck/NoAck), which needs idempotence off and loses or duplicates records on retry (use acks=all, the default)"
)

func runProducer(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	assigns := assignments(pass)
	r := newReporter(pass)

	// visit reports the options e holds: an option call, a slice literal
	// of options, an append to options, or a variable assigned any of these.
	var visit func(e ast.Expr, seen map[types.Object]bool)
	visit = func(e ast.Expr, seen map[types.Object]bool) {
		switch e := ast.Unparen(e).(type) {
		case *ast.CompositeLit:
			for _, el := range e.Elts {
				visit(el, seen)
			}
		case *ast.Ident:
			obj, ok := info.ObjectOf(e).(*types.Var)
			if !ok || seen[obj] {
				return
			}
			seen[obj] = true
			for _, a := range assigns[obj] {
				if a.Index == 0 {
					visit(a.Expr, seen)
				}
			}
		case *ast.CallExpr:
			if isBuiltin(info, e, "append") {
				for _, a := range e.Args {
					visit(a, seen)
				}
				return
			}
			fn := callee(info, e)
			switch {
			case isFunc(fn, kgoPath, "DisableIdempotentWrite"):
				r.report(e, msgNoIdempotence)
			case isFunc(fn, kgoPath, "RequiredAcks") && len(e.Args) == 1 && lowAcks(info, assigns, e.Args[0]):
				r.report(e, msgLowAcks)
			}
		}
	}

	for _, f := range sourceFiles(pass) {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || !isFunc(callee(info, call), kgoPath, "NewClient") {
				return true
			}
			for _, a := range call.Args {
				visit(a, make(map[types.Object]bool))
			}
			return true
		})
	}
	return nil, nil
}

// lowAcks reports whether e is kgo.LeaderAck() or kgo.NoAck(), directly or
// through a variable.
func lowAcks(info *types.Info, assigns map[types.Object][]assignment, e ast.Expr) bool {
	switch e := ast.Unparen(e).(type) {
	case *ast.CallExpr:
		return isFunc(callee(info, e), kgoPath, "LeaderAck", "NoAck")
	case *ast.Ident:
		obj, ok := info.ObjectOf(e).(*types.Var)
		if !ok {
			return false
		}
		for _, a := range assigns[obj] {
			if call, ok := ast.Unparen(a.Expr).(*ast.CallExpr); ok && a.Index == 0 &&
				isFunc(callee(info, call), kgoPath, "LeaderAck", "NoAck") {
				return true
			}
		}
	}
	return false
}

// isBuiltin reports whether call calls the builtin function name.
func isBuiltin(info *types.Info, call *ast.CallExpr, name string) bool {
	id, ok := ast.Unparen(call.Fun).(*ast.Ident)
	if !ok {
		return false
	}
	b, ok := info.Uses[id].(*types.Builtin)
	return ok && b.Name() == name
}

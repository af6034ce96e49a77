package idemvet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// AutoCommit reports Kafka consumers that commit offsets on their own,
// whether or not the database transaction that applied the records
// committed.
var AutoCommit = &analysis.Analyzer{
	Name: "idemautocommit",
	Doc:  "report a kgo consumer group with autocommit on, and kafka-go's ReadMessage on a group reader: offsets are committed before the database commit",
	Run:  runAutoCommit,
}

const (
	msgAutoCommit  = "kafka consumer group commits polled offsets on a timer, before the database commit: add kgo.DisableAutoCommit() and commit offsets after the transaction commits (or use idemkafka.Consumer)"
	msgReadMessage = "kafka-go ReadMessage commits the offset before the database commit: use FetchMessage, then CommitMessages after the transaction commits"
)

func runAutoCommit(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	assigns := assignments(pass)
	groupSet := groupIDAssigned(pass)
	r := newReporter(pass)
	for _, f := range sourceFiles(pass) {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			fn := callee(info, call)
			switch {
			case isFunc(fn, kgoPath, "NewClient"):
				group, manual := false, false
				complete := kgoOptions(pass, assigns, call, func(opt *ast.CallExpr) {
					switch {
					case isFunc(callee(info, opt), kgoPath, "ConsumerGroup"):
						group = true
					case isFunc(callee(info, opt), kgoPath, "DisableAutoCommit", "AutoCommitMarks"):
						manual = true
					}
				})
				if group && !manual && complete {
					r.report(call, msgAutoCommit)
				}
			case isMethod(fn, kafkagoPath, "Reader", "ReadMessage"):
				sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
				if ok && readerGroup(info, assigns, groupSet, sel.X, make(map[types.Object]bool)) != groupNo {
					r.report(call, msgReadMessage)
				}
			}
			return true
		})
	}
	return nil, nil
}

// groupKnown is what a kafka-go reader's config says of its GroupID.
type groupKnown int

const (
	groupUnknown groupKnown = iota // not seen: a parameter, a field, a helper's result
	groupNo                        // a ReaderConfig literal without GroupID (or with "")
	groupYes                       // a ReaderConfig literal with a GroupID
)

// readerGroup tells whether the kafka-go reader e was made by
// kafka.NewReader with a ReaderConfig that has a GroupID, following local
// and package variables. Every assignment of a variable must say no for
// the answer to be no.
func readerGroup(info *types.Info, assigns map[types.Object][]assignment, groupSet map[types.Object]bool, e ast.Expr, seen map[types.Object]bool) groupKnown {
	switch e := ast.Unparen(e).(type) {
	case *ast.CallExpr:
		if isFunc(callee(info, e), kafkagoPath, "NewReader") && len(e.Args) == 1 {
			return configGroup(info, assigns, groupSet, e.Args[0], seen)
		}
	case *ast.Ident:
		return varGroup(info, assigns, e, seen, func(a ast.Expr) groupKnown {
			return readerGroup(info, assigns, groupSet, a, seen)
		})
	}
	return groupUnknown
}

// configGroup tells whether the kafka-go ReaderConfig e (a literal, its
// address, a variable assigned either, or its dereference) has a GroupID.
// A variable whose GroupID field the package sets has one.
func configGroup(info *types.Info, assigns map[types.Object][]assignment, groupSet map[types.Object]bool, e ast.Expr, seen map[types.Object]bool) groupKnown {
	switch e := ast.Unparen(e).(type) {
	case *ast.UnaryExpr: // &kafka.ReaderConfig{...}
		return configGroup(info, assigns, groupSet, e.X, seen)
	case *ast.StarExpr: // *cfg
		return configGroup(info, assigns, groupSet, e.X, seen)
	case *ast.CompositeLit:
		if !isType(info.TypeOf(e), kafkagoPath, "ReaderConfig") {
			return groupUnknown
		}
		for _, el := range e.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				return groupUnknown // positional fields
			}
			if id, ok := kv.Key.(*ast.Ident); ok && id.Name == "GroupID" {
				if s, ok := constString(info, kv.Value); ok && s == "" {
					return groupNo
				}
				return groupYes
			}
		}
		return groupNo
	case *ast.Ident:
		if groupSet[info.ObjectOf(e)] {
			return groupYes
		}
		return varGroup(info, assigns, e, seen, func(a ast.Expr) groupKnown {
			return configGroup(info, assigns, groupSet, a, seen)
		})
	}
	return groupUnknown
}

// varGroup combines what of reports for every value assigned to the
// variable id: no only when every one says no.
func varGroup(info *types.Info, assigns map[types.Object][]assignment, id *ast.Ident, seen map[types.Object]bool, of func(ast.Expr) groupKnown) groupKnown {
	v, ok := info.ObjectOf(id).(*types.Var)
	if !ok || isParam(v) || len(assigns[v]) == 0 {
		return groupUnknown
	}
	if seen[v] {
		return groupNo // a cycle adds nothing
	}
	seen[v] = true
	known := groupNo
	for _, a := range assigns[v] {
		if a.Index != 0 {
			return groupUnknown
		}
		switch of(a.Expr) {
		case groupYes:
			known = groupYes
		case groupUnknown:
			return groupUnknown
		}
	}
	return known
}

// groupIDAssigned returns the variables of the package whose GroupID field
// (of a kafka-go ReaderConfig) is assigned: cfg.GroupID = ...
func groupIDAssigned(pass *analysis.Pass) map[types.Object]bool {
	info := pass.TypesInfo
	m := make(map[types.Object]bool)
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok {
				return true
			}
			for _, l := range as.Lhs {
				sel, ok := ast.Unparen(l).(*ast.SelectorExpr)
				if !ok {
					continue
				}
				v, _ := info.ObjectOf(sel.Sel).(*types.Var)
				id, ok := ast.Unparen(sel.X).(*ast.Ident)
				if ok && isField(v, kafkagoPath, "ReaderConfig", "GroupID") {
					if obj := info.ObjectOf(id); obj != nil {
						m[obj] = true
					}
				}
			}
			return true
		})
	}
	return m
}

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
	Doc:  "report Kafka consumers whose offsets are committed whether or not the database transaction that applied the records committed: a kgo consumer group with autocommit on, kafka-go's ReadMessage on a group reader, a confluent-kafka-go group with automatic offset commits, and offsets committed or marked (any client) before the database write",
	Run:  runAutoCommit,
}

const (
	msgAutoCommit  = "kafka consumer group commits polled offsets on a timer, whether or not the database transaction that applied them committed: add kgo.DisableAutoCommit() and commit offsets after the transaction commits (or use idemkafka.Consumer)"
	msgReadMessage = "kafka-go ReadMessage commits the offset before the database commit: use FetchMessage, then CommitMessages after the transaction commits"
)

func runAutoCommit(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	assigns := assignments(pass)
	var groups *groupFinder // built on first use
	r := newReporter(pass)
	for _, f := range sourceFiles(pass) {
		if isTestFile(pass, f) {
			continue // a test's consumer commits test offsets
		}
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
				if !ok {
					break
				}
				if groups == nil {
					groups = &groupFinder{info: info, assigns: assigns, fields: fieldAssignments(pass),
						decls: newSendHelpers(pass).decls, groupSet: groupIDAssigned(pass)}
				}
				groups.seen, groups.seenFn = make(map[types.Object]bool), make(map[*types.Func]bool)
				if groups.reader(sel.X) != groupNo {
					r.report(call, msgReadMessage)
				}
			}
			return true
		})
	}
	checkCommitOrder(pass, assigns, r)
	var files []*ast.File
	for _, f := range sourceFiles(pass) {
		if !isTestFile(pass, f) {
			files = append(files, f)
		}
	}
	checkConfluentAutoCommit(pass, assigns, r, files)
	return nil, nil
}

// groupKnown is what a kafka-go reader's config says of its GroupID.
type groupKnown int

const (
	groupUnknown groupKnown = iota // not seen: a parameter, a field, a helper's result
	groupNo                        // a ReaderConfig literal without GroupID (or with "")
	groupYes                       // a ReaderConfig literal with a GroupID
)

// groupFinder follows a kafka-go reader, or its ReaderConfig, to where the
// package makes it.
type groupFinder struct {
	info     *types.Info
	assigns  map[types.Object][]assignment
	fields   map[types.Object][]assignment // to struct fields
	decls    map[*types.Func]*ast.FuncDecl // the functions of the package
	groupSet map[types.Object]bool         // variables and fields whose GroupID is set
	seen     map[types.Object]bool
	seenFn   map[*types.Func]bool
}

// reader tells whether the kafka-go reader e was made by kafka.NewReader
// with a ReaderConfig that has a GroupID, following local and package
// variables, struct fields the package assigns and what the package's
// functions return. Every assignment (every return) must say no for the
// answer to be no.
func (g *groupFinder) reader(e ast.Expr) groupKnown {
	switch e := ast.Unparen(e).(type) {
	case *ast.CallExpr:
		if isFunc(callee(g.info, e), kafkagoPath, "NewReader") && len(e.Args) == 1 {
			return g.config(e.Args[0])
		}
		return g.returned(e, g.reader)
	case *ast.Ident:
		return g.variable(e, g.reader)
	case *ast.SelectorExpr:
		return g.field(e, g.reader)
	}
	return groupUnknown
}

// config tells whether the kafka-go ReaderConfig e (a literal, its
// address, a variable or field assigned either, its dereference, what a
// function of the package returns) has a GroupID. A variable or field
// whose GroupID field the package sets has one.
func (g *groupFinder) config(e ast.Expr) groupKnown {
	info := g.info
	switch e := ast.Unparen(e).(type) {
	case *ast.UnaryExpr: // &kafka.ReaderConfig{...}
		return g.config(e.X)
	case *ast.StarExpr: // *cfg
		return g.config(e.X)
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
		if g.groupSet[info.ObjectOf(e)] {
			return groupYes
		}
		return g.variable(e, g.config)
	case *ast.SelectorExpr:
		if g.groupSet[info.ObjectOf(e.Sel)] {
			return groupYes
		}
		return g.field(e, g.config)
	case *ast.CallExpr:
		return g.returned(e, g.config)
	}
	return groupUnknown
}

// variable combines what of reports for every value assigned to the
// variable id: no only when every one says no.
func (g *groupFinder) variable(id *ast.Ident, of func(ast.Expr) groupKnown) groupKnown {
	v, ok := g.info.ObjectOf(id).(*types.Var)
	if !ok || isParam(v) {
		return groupUnknown
	}
	return g.all(v, g.assigns[v], of)
}

// field combines what of reports for every value the package assigns to
// the struct field sel (c.r = kafka.NewReader(...), consumer{r: ...}): no
// only when every one says no. A field nothing in the package assigns, and
// an exported field outside package main (another package may set it),
// are unknown.
func (g *groupFinder) field(sel *ast.SelectorExpr, of func(ast.Expr) groupKnown) groupKnown {
	s, ok := g.info.Selections[sel]
	if !ok || s.Kind() != types.FieldVal {
		if v, ok := g.info.Uses[sel.Sel].(*types.Var); ok {
			return g.all(v, g.fields[v], of) // a variable of another package
		}
		return groupUnknown
	}
	v, _ := s.Obj().(*types.Var)
	if v == nil || v.Exported() && v.Pkg() != nil && v.Pkg().Name() != "main" {
		return groupUnknown // another package may set it
	}
	return g.all(v, g.fields[v], of)
}

func (g *groupFinder) all(v *types.Var, as []assignment, of func(ast.Expr) groupKnown) groupKnown {
	if v == nil || len(as) == 0 {
		return groupUnknown
	}
	if g.seen[v] {
		return groupNo // a cycle adds nothing
	}
	g.seen[v] = true
	known := groupNo
	for _, a := range as {
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

// returned combines what of reports for the first result of every return
// of call's function, one of the package: no only when every one says no.
func (g *groupFinder) returned(call *ast.CallExpr, of func(ast.Expr) groupKnown) groupKnown {
	fn := callee(g.info, call)
	decl := g.decls[fn]
	if decl == nil {
		return groupUnknown
	}
	if g.seenFn[fn] {
		return groupNo
	}
	g.seenFn[fn] = true
	known, any := groupNo, false
	ast.Inspect(decl.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			any = true
			k := groupUnknown
			if len(n.Results) > 0 {
				k = of(n.Results[0]) // a bare return of named results is unknown
			}
			switch k {
			case groupYes:
				if known == groupNo {
					known = groupYes
				}
			case groupUnknown:
				known = groupUnknown
			}
		}
		return known != groupUnknown
	})
	if !any {
		return groupUnknown
	}
	return known
}

// groupIDAssigned returns the variables and struct fields of the package
// whose GroupID field (of a kafka-go ReaderConfig) is assigned:
// cfg.GroupID = ..., s.cfg.GroupID = ...
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
				if !isField(v, kafkagoPath, "ReaderConfig", "GroupID") {
					continue
				}
				x := ast.Unparen(sel.X)
				if star, ok := x.(*ast.StarExpr); ok { // (*cfg).GroupID = ...
					x = ast.Unparen(star.X)
				}
				switch x := x.(type) {
				case *ast.Ident: // cfg.GroupID = ...
					if obj := info.ObjectOf(x); obj != nil {
						m[obj] = true
					}
				case *ast.SelectorExpr: // s.cfg.GroupID = ...
					if obj := info.ObjectOf(x.Sel); obj != nil {
						m[obj] = true
					}
				}
			}
			return true
		})
	}
	return m
}

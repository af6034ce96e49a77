package idemvet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// Producer reports Kafka producers built without idempotent writes or with
// acks below all: franz-go, sarama, confluent-kafka-go and kafka-go's Writer.
var Producer = &analysis.Analyzer{
	Name: "idemproducer",
	Doc:  "report Kafka producers without idempotent writes or with acks below all in-sync replicas (franz-go, sarama, confluent-kafka-go, kafka-go)",
	Run:  runProducer,
}

const (
	msgNoIdempotence = "kafka producer with idempotent writes disabled: remove DisableIdempotentWrite; duplicates on retry otherwise (use acks=all, the default)"
	msgLowAcks       = "kafka producer with acks below all: remove RequiredAcks(LeaderAck/NoAck), which needs idempotence off and loses or duplicates records on retry (use acks=all, the default)"
)

func runProducer(pass *analysis.Pass) (any, error) {
	if isKafkaClientPackage(pass.Pkg.Path()) {
		// The client's own code: sarama's NewConfig sets its defaults
		// (acks from the leader), a wrapper of the client passes its
		// config on. The rule is about the programs that use them.
		return nil, nil
	}
	info := pass.TypesInfo
	assigns := assignments(pass)
	r := newReporter(pass)

	for _, f := range sourceFiles(pass) {
		if isTestFile(pass, f) {
			continue // a test's producer, to a fake broker or exercising acks=0
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || !isFunc(callee(info, call), kgoPath, "NewClient") {
				return true
			}
			kgoOptions(pass, assigns, call, func(opt *ast.CallExpr) {
				fn := callee(info, opt)
				switch {
				case isFunc(fn, kgoPath, "DisableIdempotentWrite"):
					r.report(opt, msgNoIdempotence)
				case isFunc(fn, kgoPath, "RequiredAcks") && len(opt.Args) == 1 && lowAcks(info, assigns, opt.Args[0]):
					r.report(opt, msgLowAcks)
				}
			})
			return true
		})
	}
	runOtherProducers(pass, assigns, r)
	return nil, nil
}

// lowAcks reports whether e is kgo.LeaderAck() or kgo.NoAck(), directly or
// through variables, local or of the package (var acks = kgo.LeaderAck(),
// var fast = acks): one of the values assigned to them is.
func lowAcks(info *types.Info, assigns map[types.Object][]assignment, e ast.Expr) bool {
	return lowAcksSeen(info, assigns, e, make(map[types.Object]bool))
}

func lowAcksSeen(info *types.Info, assigns map[types.Object][]assignment, e ast.Expr, seen map[types.Object]bool) bool {
	switch e := ast.Unparen(e).(type) {
	case *ast.CallExpr:
		return isFunc(callee(info, e), kgoPath, "LeaderAck", "NoAck")
	case *ast.Ident:
		obj, ok := info.ObjectOf(e).(*types.Var)
		if !ok || seen[obj] {
			return false
		}
		seen[obj] = true
		for _, a := range assigns[obj] {
			if a.Index == 0 && lowAcksSeen(info, assigns, a.Expr, seen) {
				return true
			}
		}
	}
	return false
}

// kgoOptions calls fn for every kgo option call among the arguments of
// the kgo.NewClient call newClient: an option call, a slice literal of
// options, an append to options, a variable of the package assigned any
// of these, or what a function of the package returns (its first result).
// It reports whether every option could be followed: false when an
// argument holds options from elsewhere (a parameter, a field, what a
// function of another package returns), which may hold any option.
func kgoOptions(pass *analysis.Pass, assigns map[types.Object][]assignment, newClient *ast.CallExpr, fn func(opt *ast.CallExpr)) bool {
	info := pass.TypesInfo
	complete := true
	var visit func(e ast.Expr, seen map[types.Object]bool)
	// visitResults visits the first result of every return of the
	// function of the package f, reporting whether f is one.
	visitResults := func(f *types.Func, seen map[types.Object]bool) bool {
		decl := funcDecl(pass, f)
		if decl == nil {
			return false
		}
		if seen[f] {
			return true
		}
		seen[f] = true
		ast.Inspect(decl.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return false // its returns are its own
			case *ast.ReturnStmt:
				switch {
				case len(n.Results) == 0:
					complete = false // named results: not followed
				case len(n.Results) == 1 && f.Type().(*types.Signature).Results().Len() > 1:
					complete = false // return g(), spread
				default:
					visit(n.Results[0], seen)
				}
			}
			return true
		})
		return true
	}
	visit = func(e ast.Expr, seen map[types.Object]bool) {
		switch e := ast.Unparen(e).(type) {
		case *ast.CompositeLit:
			for _, el := range e.Elts {
				visit(el, seen)
			}
		case *ast.KeyValueExpr:
			visit(e.Value, seen)
		case *ast.Ident:
			switch obj := info.ObjectOf(e).(type) {
			case *types.Nil:
			case *types.Var:
				if seen[obj] {
					return
				}
				seen[obj] = true
				if len(assigns[obj]) == 0 || isParam(obj) {
					complete = false
				}
				for _, a := range assigns[obj] {
					if a.Index == 0 {
						visit(a.Expr, seen)
					} else {
						complete = false
					}
				}
			default:
				complete = false
			}
		case *ast.CallExpr:
			if isBuiltin(info, e, "append") {
				for _, a := range e.Args {
					visit(a, seen)
				}
				return
			}
			f := callee(info, e)
			if f != nil && f.Pkg() != nil && f.Pkg().Path() == kgoPath &&
				f.Type().(*types.Signature).Recv() == nil {
				fn(e)
				return
			}
			if f != nil && visitResults(f, seen) {
				return
			}
			complete = false
		default:
			complete = false
		}
	}
	for _, a := range newClient.Args {
		visit(a, make(map[types.Object]bool))
	}
	return complete
}

// funcDecl returns the declaration of f among the files of the package,
// or nil.
func funcDecl(pass *analysis.Pass, f *types.Func) *ast.FuncDecl {
	if f == nil || f.Pkg() != pass.Pkg {
		return nil
	}
	for _, file := range pass.Files {
		if file.FileStart <= f.Pos() && f.Pos() < file.FileEnd {
			for _, d := range file.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil && pass.TypesInfo.Defs[fd.Name] == f {
					return fd
				}
			}
		}
	}
	return nil
}

// isParam reports whether v is a parameter, result or receiver of a
// function: its value comes from the caller.
func isParam(v *types.Var) bool {
	return v.Kind() == types.ParamVar || v.Kind() == types.RecvVar || v.Kind() == types.ResultVar
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

// isKafkaClientPackage reports whether path is one of the Kafka client
// packages idemproducer knows: franz-go's kgo, segmentio/kafka-go, sarama
// (IBM, Shopify) or confluent-kafka-go.
func isKafkaClientPackage(path string) bool {
	return path == kgoPath || path == kafkagoPath || contains(saramaPaths, path) || contains(confluentPaths, path)
}

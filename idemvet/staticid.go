package idemvet

import (
	"go/ast"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// StaticID reports a Kafka consumer group instance ID (static membership)
// that is a constant, which every replica running the code would share.
var StaticID = &analysis.Analyzer{
	Name: "idemstaticid",
	Doc:  "report a constant consumer group instance ID (kgo.InstanceID, idemkafka.ConsumerConfig.InstanceID): every replica would share it",
	Run:  runStaticID,
}

const msgStaticID = "consumer group instance ID is a constant: every replica would share it and fence the others; derive it from the instance (pod name, host name), different per replica"

func runStaticID(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	r := newReporter(pass)
	// check reports value when it is a non-empty constant string: a
	// literal, a named constant of any package, a constant concatenation.
	check := func(value ast.Expr) {
		if s, ok := constString(info, value); ok && s != "" {
			r.report(value, msgStaticID)
		}
	}
	isInstanceID := func(field *types.Var) bool {
		return field != nil && isField(field, idemkafkaPath, "ConsumerConfig", "InstanceID")
	}
	for _, f := range sourceFiles(pass) {
		if isTestFile(pass, f) {
			continue // a test runs one consumer, or fences one on purpose
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if isFunc(callee(info, n), kgoPath, "InstanceID") && len(n.Args) == 1 {
					check(n.Args[0])
				}
			case *ast.CompositeLit:
				if !isType(info.TypeOf(n), idemkafkaPath, "ConsumerConfig") {
					return true
				}
				st := structOf(info.TypeOf(n))
				for i, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						// An unkeyed struct literal: element i is field i.
						if st != nil && i < st.NumFields() && isInstanceID(st.Field(i)) {
							check(el)
						}
						continue
					}
					if key, ok := kv.Key.(*ast.Ident); ok {
						if field, _ := info.ObjectOf(key).(*types.Var); isInstanceID(field) {
							check(kv.Value)
						}
					}
				}
			case *ast.AssignStmt:
				if n.Tok != token.ASSIGN || len(n.Lhs) != len(n.Rhs) {
					return true
				}
				for i, lhs := range n.Lhs {
					sel, ok := ast.Unparen(lhs).(*ast.SelectorExpr)
					if !ok {
						continue
					}
					if s, ok := info.Selections[sel]; ok && s.Kind() == types.FieldVal {
						if field, _ := s.Obj().(*types.Var); isInstanceID(field) {
							check(n.Rhs[i])
						}
					}
				}
			}
			return true
		})
	}
	return nil, nil
}

package idemvet

import (
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// The Kafka clients idemproducer knows besides franz-go. Their defaults are
// not idempotent: sarama's config has Producer.Idempotent false and acks
// from the leader only, librdkafka's enable.idempotence is false, and
// kafka-go's Writer waits for no acknowledgement at all (and has no
// idempotent mode). kafka-go's older constructor, NewWriter, is the
// exception: it turns a WriterConfig's RequiredAcks 0 (the zero value)
// into RequireAll, so there only 1, the leader, is below all.
var (
	saramaPaths    = []string{"github.com/IBM/sarama", "github.com/Shopify/sarama"}
	confluentPaths = []string{"github.com/confluentinc/confluent-kafka-go/v2/kafka", "github.com/confluentinc/confluent-kafka-go/kafka"}
)

const (
	msgSaramaNoIdempotence = "sarama producer without idempotence (sarama's default): set Producer.Idempotent = true, Producer.RequiredAcks = sarama.WaitForAll and Net.MaxOpenRequests = 1; duplicates on retry otherwise"
	msgSaramaOff           = "sarama producer with idempotence disabled: set Producer.Idempotent = true (with Producer.RequiredAcks = sarama.WaitForAll and Net.MaxOpenRequests = 1); duplicates on retry otherwise"
	msgSaramaLowAcks       = "sarama producer with acks below all: use Producer.RequiredAcks = sarama.WaitForAll, which idempotence needs; records are lost or duplicated on retry otherwise"
	msgConfluentNoIdem     = "confluent-kafka-go producer without enable.idempotence (librdkafka's default is off): add \"enable.idempotence\": true to its ConfigMap; duplicates on retry otherwise"
	msgConfluentOff        = "confluent-kafka-go producer with enable.idempotence off: set it to true; duplicates on retry otherwise"
	msgConfluentLowAcks    = "confluent-kafka-go producer with acks below all: remove acks (enable.idempotence sets all); records are lost or duplicated on retry otherwise"
	msgKafkaGoAcks         = "kafka-go Writer without RequiredAcks: kafka.RequireAll (its default waits for no acknowledgement, and it has no idempotent mode: records are lost, or duplicated on retry; deduplicate on the consumer side by event ID)"
	msgKafkaGoConfigAcks   = "kafka-go WriterConfig with RequiredAcks 1 (the leader only): remove it or set -1, NewWriter's default, which waits for all replicas (kafka-go has no idempotent mode: records are lost, or duplicated on retry; deduplicate on the consumer side by event ID)"
)

// runOtherProducers reports the producers of sarama, confluent-kafka-go and
// segmentio/kafka-go configured without idempotence or with acks below
// all. Test files are skipped, as for franz-go.
func runOtherProducers(pass *analysis.Pass, assigns map[types.Object][]assignment, r *reporter) {
	info := pass.TypesInfo
	// The acks settings are constants, or package-level variables
	// initialised with one.
	inits := packageVarInits(pass)
	lowAcksConst := func(e ast.Expr) bool { return acksIn(info, inits, e, 0, 1) }
	leaderAcksConst := func(e ast.Expr) bool { return acksIn(info, inits, e, 1) }
	var files []*ast.File
	for _, f := range sourceFiles(pass) {
		if !isTestFile(pass, f) {
			files = append(files, f)
		}
	}
	inspect := func(fn func(n ast.Node) bool) {
		for _, f := range files {
			ast.Inspect(f, fn)
		}
	}

	// What the package sets anywhere, in any of its functions: a config
	// built in one function is often used in another.
	saramaIdem, confluentIdem, kafkaGoAcks := false, false, false
	// The variables and struct fields holding a kafka-go Writer whose
	// RequiredAcks the package assigns: that assignment decides, and is
	// reported when it is below all.
	kafkaGoAcksSet := make(map[types.Object]bool)
	// The struct fields holding a kafka-go Writer (not a pointer) that
	// the package writes through: p.w.WriteMessages(...).
	writtenFields := make(map[types.Object]bool)
	inspect(func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if len(n.Lhs) != len(n.Rhs) {
				return true
			}
			for i, l := range n.Lhs {
				v := ast.Unparen(n.Rhs[i])
				switch {
				case saramaField(info, l, "Producer", "Idempotent"):
					if b, ok := constBool(info, v); ok && !b {
						r.report(n, msgSaramaOff)
					} else {
						saramaIdem = true
					}
				case saramaField(info, l, "Producer", "RequiredAcks"):
					if lowAcksConst(v) {
						r.report(n, msgSaramaLowAcks)
					}
				case kafkaGoWriterField(info, l):
					if lowAcksConst(v) {
						r.report(n, msgKafkaGoAcks)
					} else {
						kafkaGoAcks = true
					}
					if obj := holder(info, l.(*ast.SelectorExpr).X); obj != nil {
						kafkaGoAcksSet[obj] = true
					}
				case kafkaGoConfigField(info, l):
					if leaderAcksConst(v) {
						r.report(n, msgKafkaGoConfigAcks)
					}
				case isConfluentMapIndex(info, l):
					key, _ := constString(info, l.(*ast.IndexExpr).Index)
					confluentIdem = confluentSetting(r, n, key, info, inits, v) || confluentIdem
				}
			}
		case *ast.CompositeLit:
			if isType(info.TypeOf(n), kafkagoPath, "WriterConfig") {
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok && isIdent(kv.Key, "RequiredAcks") && leaderAcksConst(kv.Value) {
						r.report(kv, msgKafkaGoConfigAcks)
					}
				}
			}
			if isConfluentMap(info.TypeOf(n)) {
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					key, _ := constString(info, kv.Key)
					confluentIdem = confluentSetting(r, kv, key, info, inits, ast.Unparen(kv.Value)) || confluentIdem
				}
			}
		case *ast.CallExpr:
			fn := callee(info, n)
			if recv := recvType(fn); recv != nil && fn.Name() == "SetKey" && len(n.Args) == 2 && isConfluentMap(recv) {
				key, _ := constString(info, n.Args[0])
				confluentIdem = confluentSetting(r, n, key, info, inits, ast.Unparen(n.Args[1])) || confluentIdem
			}
			if isMethod(fn, kafkagoPath, "Writer", "WriteMessages") {
				if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok {
					if f := selectedField(info, sel.X); f != nil {
						writtenFields[f] = true
					}
				}
			}
		}
		return true
	})

	var fields map[types.Object][]assignment // struct fields, made on first use

	// The Writer literals (and new(kafka.Writer) calls) stored in a
	// variable or field whose RequiredAcks is assigned afterwards (w :=
	// &kafka.Writer{...}; w.RequiredAcks = ...): the assignment is judged,
	// not the literal.
	acksSetLater := make(map[ast.Expr]bool)
	if !kafkaGoAcks {
		for obj := range kafkaGoAcksSet {
			as := assigns[obj]
			if v, ok := obj.(*types.Var); ok && v.IsField() {
				if fields == nil {
					fields = nonTestFieldAssignments(pass)
				}
				as = fields[obj]
			}
			for _, a := range as {
				e := ast.Unparen(a.Expr)
				if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
					e = ast.Unparen(u.X)
				}
				if a.Index != 0 {
					continue
				}
				if lit, ok := e.(*ast.CompositeLit); ok {
					acksSetLater[lit] = true
				} else if call, ok := e.(*ast.CallExpr); ok && isNewWriter(info, call) {
					acksSetLater[call] = true
				}
			}
		}
	}
	inspect(func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if !kafkaGoAcks && isNewWriter(info, n) && !acksSetLater[n] {
				r.report(n, msgKafkaGoAcks) // new(kafka.Writer): a zero Writer
			}
			fn := callee(info, n)
			switch {
			case !saramaIdem && isFuncIn(fn, saramaPaths, "NewSyncProducer", "NewAsyncProducer") && len(n.Args) == 2:
				// The config passed here, or made by NewConfig in the
				// package: reported where it is made, once.
				if fields == nil {
					fields = nonTestFieldAssignments(pass)
				}
				if c := saramaConfigCall(pass, assigns, fields, n.Args[1], map[any]bool{}); c != nil {
					r.report(c, msgSaramaNoIdempotence)
				} else if isNilExpr(info, n.Args[1]) {
					r.report(n, msgSaramaNoIdempotence)
				}
			case !saramaIdem && isFuncIn(fn, saramaPaths, "NewSyncProducerFromClient", "NewAsyncProducerFromClient") && len(n.Args) == 1:
				// The config of the client, made by sarama.NewClient in
				// the package (directly or through a variable).
				if fields == nil {
					fields = nonTestFieldAssignments(pass)
				}
				if nc := saramaNewClient(info, assigns, n.Args[0]); nc != nil {
					if c := saramaConfigCall(pass, assigns, fields, nc.Args[1], map[any]bool{}); c != nil {
						r.report(c, msgSaramaNoIdempotence)
					} else if isNilExpr(info, nc.Args[1]) {
						r.report(n, msgSaramaNoIdempotence)
					}
				}
			case !confluentIdem && isFuncIn(fn, confluentPaths, "NewProducer") && len(n.Args) == 1 &&
				confluentMapFromPackage(pass, assigns, n.Args[0]):
				r.report(n, msgConfluentNoIdem)
			}
		case *ast.ValueSpec:
			// var w kafka.Writer: a zero Writer, unless the variable is
			// assigned another afterwards or its RequiredAcks is.
			if kafkaGoAcks || len(n.Values) != 0 {
				break
			}
			for _, name := range n.Names {
				if v, ok := info.Defs[name].(*types.Var); ok && isWriterValue(v.Type()) && !kafkaGoAcksSet[v] && len(assigns[v]) == 0 {
					r.report(name, msgKafkaGoAcks)
				}
			}
		case *ast.StructType:
			// A field of type kafka.Writer the package writes through: a
			// zero Writer in every value of the struct, unless the package
			// assigns the field (checked there) or its RequiredAcks. An
			// exported field outside package main may be set by another
			// package.
			if kafkaGoAcks {
				break
			}
			for _, fl := range n.Fields.List {
				for _, name := range fl.Names {
					v, ok := info.Defs[name].(*types.Var)
					if !ok || !isWriterValue(v.Type()) || !writtenFields[v] || kafkaGoAcksSet[v] ||
						v.Exported() && pass.Pkg.Name() != "main" {
						continue
					}
					if fields == nil {
						fields = nonTestFieldAssignments(pass)
					}
					if len(fields[v]) == 0 {
						r.report(name, msgKafkaGoAcks)
					}
				}
			}
		case *ast.CompositeLit:
			if !kafkaGoAcks && isType(info.TypeOf(n), kafkagoPath, "Writer") && !hasField(n, "RequiredAcks") && !acksSetLater[n] {
				r.report(n, msgKafkaGoAcks)
			}
			if isType(info.TypeOf(n), kafkagoPath, "Writer") {
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok && isIdent(kv.Key, "RequiredAcks") && lowAcksConst(kv.Value) {
						r.report(kv, msgKafkaGoAcks)
					}
				}
			}
		}
		return true
	})
}

// confluentSetting reports a confluent-kafka-go setting key = v at n when it
// turns idempotence off or lowers acks (a constant, or a package-level
// variable of inits), and returns whether it turns idempotence on.
func confluentSetting(r *reporter, n ast.Node, key string, info *types.Info, inits map[*types.Var]ast.Expr, v ast.Expr) bool {
	switch key {
	case "enable.idempotence":
		if b, ok := configBool(info, v); ok {
			if !b {
				r.report(n, msgConfluentOff)
			}
			return b
		}
		return true // not a constant: it may be on
	case "acks", "request.required.acks":
		if s, ok := configString(constValue(info, inits, v)); ok && (s == "0" || s == "1") {
			r.report(n, msgConfluentLowAcks)
		}
	}
	return false
}

// saramaConfigCall returns the sarama.NewConfig() call e is, or the one a
// variable of the package e names was assigned, or a struct field e
// selects (fields: what the package's non-test files assign to them), or
// that a function of the package e calls returns; nil when e comes from
// elsewhere.
func saramaConfigCall(pass *analysis.Pass, assigns, fields map[types.Object][]assignment, e ast.Expr, seen map[any]bool) *ast.CallExpr {
	info := pass.TypesInfo
	switch e := ast.Unparen(e).(type) {
	case *ast.CallExpr:
		fn := callee(info, e)
		if isFuncIn(fn, saramaPaths, "NewConfig") {
			return e
		}
		decl := funcDecl(pass, fn)
		if decl == nil || seen[fn] {
			return nil
		}
		seen[fn] = true
		var found *ast.CallExpr
		ast.Inspect(decl.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return false // its returns are its own
			case *ast.ReturnStmt:
				if found == nil && len(n.Results) > 0 {
					found = saramaConfigCall(pass, assigns, fields, n.Results[0], seen)
				}
			}
			return found == nil
		})
		return found
	case *ast.Ident:
		v, ok := info.ObjectOf(e).(*types.Var)
		if !ok || isParam(v) || seen[v] {
			return nil
		}
		seen[v] = true
		return saramaConfigAssigned(pass, assigns, fields, assigns[v], seen)
	case *ast.SelectorExpr:
		// A struct field the package assigns (c.Config =
		// DefaultConfig(), publisher{cfg: sarama.NewConfig()}), in a file
		// that is not a test's: a config the package makes and puts
		// there, whoever else may also set it.
		s, ok := info.Selections[e]
		if !ok || s.Kind() != types.FieldVal {
			return nil
		}
		v, _ := s.Obj().(*types.Var)
		if v == nil || seen[v] {
			return nil
		}
		seen[v] = true
		return saramaConfigAssigned(pass, assigns, fields, fields[v], seen)
	}
	return nil
}

// saramaNewClient returns the sarama.NewClient(addrs, config) call e is, or
// that a local variable e names was assigned (client, err :=
// sarama.NewClient(...)); nil otherwise.
func saramaNewClient(info *types.Info, assigns map[types.Object][]assignment, e ast.Expr) *ast.CallExpr {
	switch e := ast.Unparen(e).(type) {
	case *ast.CallExpr:
		if isFuncIn(callee(info, e), saramaPaths, "NewClient") && len(e.Args) == 2 {
			return e
		}
	case *ast.Ident:
		v, ok := info.ObjectOf(e).(*types.Var)
		if !ok || isParam(v) {
			return nil
		}
		for _, a := range assigns[v] {
			if a.Index != 0 {
				continue
			}
			if call, ok := ast.Unparen(a.Expr).(*ast.CallExpr); ok && isFuncIn(callee(info, call), saramaPaths, "NewClient") && len(call.Args) == 2 {
				return call
			}
		}
	}
	return nil
}

// saramaConfigAssigned returns the first sarama.NewConfig() call that one of
// the values as is or comes from, as saramaConfigCall finds it.
func saramaConfigAssigned(pass *analysis.Pass, assigns, fields map[types.Object][]assignment, as []assignment, seen map[any]bool) *ast.CallExpr {
	for _, a := range as {
		if a.Index != 0 {
			continue
		}
		if c := saramaConfigCall(pass, assigns, fields, a.Expr, seen); c != nil {
			return c
		}
	}
	return nil
}

// nonTestFieldAssignments is fieldAssignments without the assignments made
// in test files: a test's config is not the program's.
func nonTestFieldAssignments(pass *analysis.Pass) map[types.Object][]assignment {
	m := fieldAssignments(pass)
	for obj, as := range m {
		kept := as[:0]
		for _, a := range as {
			if !strings.HasSuffix(pass.Fset.File(a.Expr.Pos()).Name(), "_test.go") {
				kept = append(kept, a)
			}
		}
		m[obj] = kept
	}
	return m
}

// confluentMapFromPackage reports whether e is a ConfigMap literal (or its
// address), a variable of the package assigned one, or what a function of
// the package returns (every return one of these): its settings are all in
// the package. A map that a setting with a key not constant is written to
// (for k, v := range overrides { cfg[k] = v }: a configuration file's
// librdkafka section) is not: it may hold any setting.
func confluentMapFromPackage(pass *analysis.Pass, assigns map[types.Object][]assignment, e ast.Expr) bool {
	return confluentMapSeen(pass, assigns, confluentDynamicKeys(pass), e, make(map[any]bool))
}

func confluentMapSeen(pass *analysis.Pass, assigns map[types.Object][]assignment, dynamic map[types.Object]bool, e ast.Expr, seen map[any]bool) bool {
	info := pass.TypesInfo
	switch e := ast.Unparen(e).(type) {
	case *ast.UnaryExpr:
		return e.Op == token.AND && confluentMapSeen(pass, assigns, dynamic, e.X, seen)
	case *ast.StarExpr:
		return confluentMapSeen(pass, assigns, dynamic, e.X, seen)
	case *ast.CompositeLit:
		return isConfluentMap(info.TypeOf(e))
	case *ast.Ident:
		v, ok := info.ObjectOf(e).(*types.Var)
		if !ok || isParam(v) || len(assigns[v]) == 0 || dynamic[v] {
			return false
		}
		if seen[v] {
			return true // a cycle adds nothing
		}
		seen[v] = true
		for _, a := range assigns[v] {
			if a.Index != 0 || !confluentMapSeen(pass, assigns, dynamic, a.Expr, seen) {
				return false
			}
		}
		return true
	case *ast.CallExpr:
		fn := callee(info, e)
		decl := funcDecl(pass, fn)
		if decl == nil {
			return false
		}
		if seen[fn] {
			return true
		}
		seen[fn] = true
		multi := fn.Type().(*types.Signature).Results().Len() > 1
		all, returns := true, false
		ast.Inspect(decl.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return false // its returns are its own
			case *ast.ReturnStmt:
				returns = true
				if len(n.Results) == 0 || len(n.Results) == 1 && multi ||
					!confluentMapSeen(pass, assigns, dynamic, n.Results[0], seen) {
					all = false
				}
			}
			return all
		})
		return returns && all
	}
	return false
}

// confluentDynamicKeys returns the variables holding a ConfigMap that a
// setting whose key is not a constant is written to: cfg[k] = v,
// (*cfg)[k] = v, cfg.SetKey(k, v).
func confluentDynamicKeys(pass *analysis.Pass) map[types.Object]bool {
	info := pass.TypesInfo
	m := make(map[types.Object]bool)
	add := func(x ast.Expr) {
		if id := rootIdent(x); id != nil {
			if obj := info.ObjectOf(id); obj != nil {
				m[obj] = true
			}
		}
	}
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, l := range n.Lhs {
					if isConfluentMapIndex(info, l) {
						ix := ast.Unparen(l).(*ast.IndexExpr)
						if _, ok := constString(info, ix.Index); !ok {
							add(ix.X)
						}
					}
				}
			case *ast.CallExpr:
				fn := callee(info, n)
				if recv := recvType(fn); recv != nil && fn.Name() == "SetKey" && len(n.Args) == 2 && isConfluentMap(recv) {
					if _, ok := constString(info, n.Args[0]); !ok {
						if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok {
							add(sel.X)
						}
					}
				}
			}
			return true
		})
	}
	return m
}

// saramaField reports whether e is X.group.name with X a sarama Config (or
// a pointer to one).
func saramaField(info *types.Info, e ast.Expr, group, name string) bool {
	sel, ok := ast.Unparen(e).(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	inner, ok := ast.Unparen(sel.X).(*ast.SelectorExpr)
	if !ok || inner.Sel.Name != group {
		return false
	}
	t := info.TypeOf(inner.X)
	for _, p := range saramaPaths {
		if isType(t, p, "Config") {
			return true
		}
	}
	return false
}

// acksIn reports whether the value of e (a constant, or a package-level
// variable of inits, see constValue) is an integer among want: 0 or 1 are
// acks below all (sarama's NoResponse and WaitForLocal, kafka-go's
// RequireNone and RequireOne), 1 alone for a kafka-go WriterConfig, whose
// NewWriter turns 0 into all.
func acksIn(info *types.Info, inits map[*types.Var]ast.Expr, e ast.Expr, want ...int64) bool {
	v := constValue(info, inits, e)
	if v == nil {
		return false
	}
	n, ok := constant.Int64Val(v)
	if !ok {
		return false
	}
	for _, w := range want {
		if n == w {
			return true
		}
	}
	return false
}

// kafkaGoWriterField reports whether e is w.RequiredAcks with w a kafka-go
// Writer.
func kafkaGoWriterField(info *types.Info, e ast.Expr) bool {
	sel, ok := ast.Unparen(e).(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "RequiredAcks" && isType(info.TypeOf(sel.X), kafkagoPath, "Writer")
}

// kafkaGoConfigField reports whether e is c.RequiredAcks with c a kafka-go
// WriterConfig.
func kafkaGoConfigField(info *types.Info, e ast.Expr) bool {
	sel, ok := ast.Unparen(e).(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "RequiredAcks" && isType(info.TypeOf(sel.X), kafkagoPath, "WriterConfig")
}

// holder returns the variable, or the struct field, that the expression e
// names (w, p.w, *w); nil otherwise.
func holder(info *types.Info, e ast.Expr) types.Object {
	e = ast.Unparen(e)
	if star, ok := e.(*ast.StarExpr); ok {
		e = ast.Unparen(star.X)
	}
	switch e := e.(type) {
	case *ast.Ident:
		if v, ok := info.ObjectOf(e).(*types.Var); ok {
			return v
		}
	case *ast.SelectorExpr:
		if s, ok := info.Selections[e]; ok && s.Kind() == types.FieldVal {
			return s.Obj()
		}
	}
	return nil
}

// isWriterValue reports whether t is kafka-go's Writer itself, not a
// pointer to one: a variable or field of that type holds a Writer.
func isWriterValue(t types.Type) bool {
	n, ok := types.Unalias(t).(*types.Named)
	return ok && isNamed(n, kafkagoPath, "Writer")
}

// isNewWriter reports whether call is new(kafka.Writer): a zero Writer.
func isNewWriter(info *types.Info, call *ast.CallExpr) bool {
	if !isBuiltin(info, call, "new") || len(call.Args) != 1 {
		return false
	}
	tv, ok := info.Types[call.Args[0]]
	return ok && tv.IsType() && isWriterValue(tv.Type)
}

// selectedField returns the struct field e selects (p.w), or nil.
func selectedField(info *types.Info, e ast.Expr) *types.Var {
	sel, ok := ast.Unparen(e).(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	s, ok := info.Selections[sel]
	if !ok || s.Kind() != types.FieldVal {
		return nil
	}
	v, _ := s.Obj().(*types.Var)
	return v
}

// isConfluentMap reports whether t is confluent-kafka-go's ConfigMap or a
// pointer to it.
func isConfluentMap(t types.Type) bool {
	for _, p := range confluentPaths {
		if isType(t, p, "ConfigMap") {
			return true
		}
	}
	return false
}

// isConfluentMapIndex reports whether e is m[key] with m a ConfigMap.
func isConfluentMapIndex(info *types.Info, e ast.Expr) bool {
	ix, ok := ast.Unparen(e).(*ast.IndexExpr)
	return ok && isConfluentMap(info.TypeOf(ix.X))
}

// configBool returns the boolean a ConfigMap value stands for: a constant
// bool, or the string "true" or "false".
func configBool(info *types.Info, e ast.Expr) (value, ok bool) {
	if b, ok := constBool(info, e); ok {
		return b, true
	}
	if s, ok := constString(info, e); ok {
		switch strings.ToLower(s) {
		case "true":
			return true, true
		case "false":
			return false, true
		}
	}
	return false, false
}

// configString returns a constant ConfigMap value as text: a string, or an
// integer.
func configString(v constant.Value) (string, bool) {
	if v == nil {
		return "", false
	}
	switch v.Kind() {
	case constant.String:
		return constant.StringVal(v), true
	case constant.Int:
		return v.ExactString(), true
	}
	return "", false
}

// constValue returns the value of e when it is a constant (a literal, a
// named constant of any package), a package-level variable of inits (see
// packageVarInits) whose initialiser has one, or a conversion of one of
// these to an integer or string type (kafka.RequiredAcks(acks)); nil
// otherwise.
func constValue(info *types.Info, inits map[*types.Var]ast.Expr, e ast.Expr) constant.Value {
	for range 8 { // a chain of variables, var a = b; var b = 1, not a cycle
		e = ast.Unparen(e)
		if tv, ok := info.Types[e]; ok && tv.Value != nil {
			return tv.Value
		}
		switch x := e.(type) {
		case *ast.Ident:
			v, ok := info.Uses[x].(*types.Var)
			if !ok || inits[v] == nil {
				return nil
			}
			e = inits[v]
		case *ast.CallExpr:
			fun, ok := info.Types[x.Fun]
			if !ok || !fun.IsType() || len(x.Args) != 1 {
				return nil
			}
			b, ok := fun.Type.Underlying().(*types.Basic)
			if !ok || b.Info()&(types.IsInteger|types.IsString) == 0 {
				return nil
			}
			v := constValue(info, inits, x.Args[0])
			if v == nil || b.Info()&types.IsInteger != 0 && v.Kind() != constant.Int ||
				b.Info()&types.IsString != 0 && v.Kind() != constant.String {
				return nil // string(65) is "A", int("1") does not compile
			}
			return v
		default:
			return nil
		}
	}
	return nil
}

// packageVarInits maps the package-level variables declared, in the
// package's files other than its tests, with an initialiser of their own
// (var acks = kafka.RequireOne; not var a, b = f()) to it, when nothing in
// those files writes them again: no assignment, ++ or --, range
// assignment, address taken (flag.IntVar(&acks, ...)) or method with a
// pointer receiver (acks.UnmarshalText). Such a variable holds its
// initialiser's value in every run of the program. Another package may
// still set an exported one: its initialiser is the default.
func packageVarInits(pass *analysis.Pass) map[*types.Var]ast.Expr {
	info := pass.TypesInfo
	inits := make(map[*types.Var]ast.Expr)
	var files []*ast.File
	for _, f := range pass.Files {
		if !isTestFile(pass, f) {
			files = append(files, f)
		}
	}
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				if len(vs.Values) != len(vs.Names) {
					continue
				}
				for i, name := range vs.Names {
					if v, ok := info.Defs[name].(*types.Var); ok {
						inits[v] = vs.Values[i]
					}
				}
			}
		}
	}
	if len(inits) == 0 {
		return inits
	}
	// written drops the variable at the root of e (v, v.f, v[i]).
	var written func(e ast.Expr)
	written = func(e ast.Expr) {
		switch x := ast.Unparen(e).(type) {
		case *ast.Ident:
			if v, ok := info.Uses[x].(*types.Var); ok {
				delete(inits, v)
			}
		case *ast.SelectorExpr:
			written(x.X)
		case *ast.IndexExpr:
			written(x.X)
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, l := range n.Lhs {
					written(l)
				}
			case *ast.IncDecStmt:
				written(n.X)
			case *ast.RangeStmt:
				if n.Tok == token.ASSIGN {
					if n.Key != nil {
						written(n.Key)
					}
					if n.Value != nil {
						written(n.Value)
					}
				}
			case *ast.UnaryExpr:
				if n.Op == token.AND {
					written(n.X)
				}
			case *ast.SelectorExpr:
				// A method with a pointer receiver called on an
				// addressable value takes its address.
				s, ok := info.Selections[n]
				if !ok || s.Kind() != types.MethodVal && s.Kind() != types.MethodExpr {
					break
				}
				recv := s.Obj().Type().(*types.Signature).Recv()
				if _, ptr := recv.Type().Underlying().(*types.Pointer); ptr && s.Kind() == types.MethodVal && !s.Indirect() {
					if _, isPtr := info.TypeOf(n.X).Underlying().(*types.Pointer); !isPtr {
						written(n.X)
					}
				}
			}
			return true
		})
	}
	return inits
}

// constBool returns the value of e when it is a constant bool.
func constBool(info *types.Info, e ast.Expr) (value, ok bool) {
	tv, ok := info.Types[e]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.Bool {
		return false, false
	}
	return constant.BoolVal(tv.Value), true
}

// isFuncIn reports whether fn is one of the package-level functions names
// of one of the packages paths.
func isFuncIn(fn *types.Func, paths []string, names ...string) bool {
	for _, p := range paths {
		if isFunc(fn, p, names...) {
			return true
		}
	}
	return false
}

// isNilExpr reports whether e is the untyped nil.
func isNilExpr(info *types.Info, e ast.Expr) bool {
	id, ok := ast.Unparen(e).(*ast.Ident)
	if !ok {
		return false
	}
	_, isNil := info.ObjectOf(id).(*types.Nil)
	return isNil
}

// hasField reports whether the struct literal lit sets the field name.
func hasField(lit *ast.CompositeLit, name string) bool {
	for _, el := range lit.Elts {
		if kv, ok := el.(*ast.KeyValueExpr); ok && isIdent(kv.Key, name) {
			return true
		}
	}
	return false
}

// isIdent reports whether e is the identifier name.
func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

package idemvet

import (
	"go/ast"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// Consumer reports Kafka consume loops (franz-go, segmentio/kafka-go,
// sarama or confluent-kafka-go) that write to a database without
// deduplicating the records, in the polling function or in a function of
// the package it hands the records to.
var Consumer = &analysis.Analyzer{
	Name: "idemconsumer",
	Doc:  "report a function that polls Kafka (franz-go, kafka-go, sarama, confluent-kafka-go) and writes to a database without idem's inbox, itself or in a function of the package it hands the records to",
	Run:  runConsumer,
}

const msgConsumer = "kafka consumer writes to the database without deduplication: apply records through inbox (or idemkafka.Consumer) so a redelivery is not applied twice"

// consumerMaxDepth bounds how far idemconsumer follows the records from
// the polling function into the package's functions (and looks for a
// dedup in what those call).
const consumerMaxDepth = 4

// consumerSummary is what idemconsumer needs of one function body.
type consumerSummary struct {
	polls bool
	dedup bool
	execs []*ast.CallExpr
	// recordCalls are the package's functions the body hands a Kafka
	// record (or a fetch, or a batch of records) to: called with one as
	// an argument, or given as a function value taking one (EachRecord's
	// callback).
	recordCalls []*types.Func
	// calls are all the package's functions the body calls.
	calls []*types.Func
}

func runConsumer(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	r := newReporter(pass)
	assigns := assignments(pass)
	decls := make(map[*types.Func]*ast.BlockStmt)
	for _, f := range sourceFiles(pass) {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				if fn, ok := info.Defs[fd.Name].(*types.Func); ok {
					decls[fn] = fd.Body
				}
			}
		}
	}
	summaries := make(map[*ast.BlockStmt]*consumerSummary)
	summary := func(body *ast.BlockStmt) *consumerSummary {
		s, ok := summaries[body]
		if !ok {
			s = summarizeConsumer(pass, assigns, body)
			summaries[body] = s
		}
		return s
	}
	funcBodies(pass, func(body *ast.BlockStmt) {
		s := summary(body)
		if !s.polls || s.dedup {
			return
		}
		// The functions the records reach, then everything those call:
		// a dedup in any of them (a helper that marks the event as
		// processed) covers the writes.
		// What is derived from a record (decoded into a variable of the
		// service's type, a field of it) reaches the functions it is
		// given to; in those, every parameter is the record's.
		derived := make(map[*types.Func][]*types.Func)
		fromParams := func(fn *types.Func, s *consumerSummary) []*types.Func {
			out, ok := derived[fn]
			if !ok {
				out = append(derivedCalls(pass, decls[fn], fn), s.recordCalls...)
				derived[fn] = out
			}
			return out
		}
		start := append(derivedCalls(pass, body, nil), s.recordCalls...)
		reached := followCalls(decls, summary, start, fromParams)
		for _, fn := range followCalls(decls, summary, append(reached, s.calls...), func(_ *types.Func, s *consumerSummary) []*types.Func { return s.calls }) {
			if summary(decls[fn]).dedup {
				return
			}
		}
		for _, e := range s.execs {
			r.report(e, msgConsumer)
		}
		for _, fn := range reached {
			for _, e := range summary(decls[fn]).execs {
				r.report(e, msgConsumer)
			}
		}
	})
	return nil, nil
}

// followCalls returns the package's functions (with a body in decls)
// reachable from start through next, at most consumerMaxDepth calls deep,
// each once, start included.
func followCalls(decls map[*types.Func]*ast.BlockStmt, summary func(*ast.BlockStmt) *consumerSummary, start []*types.Func, next func(*types.Func, *consumerSummary) []*types.Func) []*types.Func {
	var out []*types.Func
	seen := make(map[*types.Func]bool)
	level := start
	for depth := 0; depth < consumerMaxDepth && len(level) > 0; depth++ {
		var nextLevel []*types.Func
		for _, fn := range level {
			body, ok := decls[fn]
			if !ok || seen[fn] {
				continue
			}
			seen[fn] = true
			out = append(out, fn)
			nextLevel = append(nextLevel, next(fn, summary(body))...)
		}
		level = nextLevel
	}
	return out
}

func summarizeConsumer(pass *analysis.Pass, assigns map[types.Object][]assignment, body *ast.BlockStmt) *consumerSummary {
	info := pass.TypesInfo
	s := &consumerSummary{}
	local := func(fn *types.Func) bool { return fn != nil && fn.Pkg() == pass.Pkg }
	ast.Inspect(body, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && usesDedupPackage(info, id) {
			s.dedup = true
		}
		// Any constant string: a literal, a named constant (of this
		// package or another), a constant concatenation.
		if e, ok := n.(ast.Expr); ok {
			if q, ok := constString(info, e); ok && dedupSQL(q) {
				s.dedup = true
			}
		}
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		fn := callee(info, call)
		switch {
		case isPoll(fn):
			s.polls = true
		case dbHandle(fn) != notDB && contains(execNames, fn.Name()) && !isAdminSQL(info, call),
			isWriteQuery(info, assigns, call):
			s.execs = append(s.execs, call)
		}
		if fn != nil && dedupName(fn.Name()) {
			s.dedup = true
		}
		if local(fn) {
			s.calls = append(s.calls, fn)
			for _, a := range call.Args {
				if isKafkaRecord(info.TypeOf(a)) {
					s.recordCalls = append(s.recordCalls, fn)
					break
				}
			}
		}
		// A function of the package given as a value that takes a record:
		// fetches.EachRecord(h.handle).
		for _, a := range call.Args {
			if fv := funcValue(info, a); local(fv) && takesKafkaRecord(fv) {
				s.calls = append(s.calls, fv)
				s.recordCalls = append(s.recordCalls, fv)
			}
		}
		return true
	})
	return s
}

// funcValue returns the function or method e names as a value (h.handle,
// handle), or nil.
func funcValue(info *types.Info, e ast.Expr) *types.Func {
	var id *ast.Ident
	switch e := ast.Unparen(e).(type) {
	case *ast.Ident:
		id = e
	case *ast.SelectorExpr:
		id = e.Sel
	default:
		return nil
	}
	fn, _ := info.Uses[id].(*types.Func)
	if fn == nil {
		return nil
	}
	return fn.Origin()
}

// takesKafkaRecord reports whether one of fn's parameters is a Kafka record.
func takesKafkaRecord(fn *types.Func) bool {
	sig, ok := fn.Type().(*types.Signature)
	if !ok {
		return false
	}
	for v := range sig.Params().Variables() {
		if isKafkaRecord(v.Type()) {
			return true
		}
	}
	return false
}

// isKafkaRecord reports whether t holds consumed Kafka records: franz-go's
// Record, Fetches, Fetch, FetchTopic, FetchPartition or
// FetchTopicPartition (what EachPartition hands its callback), kafka-go's or
// confluent-kafka-go's Message, sarama's ConsumerMessage, also through
// pointers and slices.
func isKafkaRecord(t types.Type) bool {
	for t != nil {
		switch u := t.(type) {
		case *types.Pointer:
			t = u.Elem()
			continue
		case *types.Slice:
			t = u.Elem()
			continue
		}
		break
	}
	n, ok := types.Unalias(t).(*types.Named)
	if !ok {
		return false
	}
	if isNamed(n, kgoPath, "Record", "Fetches", "Fetch", "FetchTopic", "FetchPartition", "FetchTopicPartition") ||
		isNamed(n, kafkagoPath, "Message") {
		return true
	}
	for _, p := range saramaPaths {
		if isNamed(n, p, "ConsumerMessage") {
			return true
		}
	}
	for _, p := range confluentPaths {
		if isNamed(n, p, "Message") {
			return true
		}
	}
	return false
}

// isPoll reports whether fn receives Kafka records: franz-go's
// PollFetches and PollRecords, kafka-go's FetchMessage and ReadMessage,
// sarama's Messages of a ConsumerGroupClaim or PartitionConsumer (the
// loop of a ConsumerGroupHandler's ConsumeClaim), confluent-kafka-go's
// Poll and ReadMessage.
func isPoll(fn *types.Func) bool {
	if isMethod(fn, kgoPath, "Client", "PollFetches", "PollRecords") ||
		isMethod(fn, kafkagoPath, "Reader", "FetchMessage", "ReadMessage") {
		return true
	}
	for _, p := range saramaPaths {
		if isMethod(fn, p, "ConsumerGroupClaim", "Messages") || isMethod(fn, p, "PartitionConsumer", "Messages") {
			return true
		}
	}
	for _, p := range confluentPaths {
		if isMethod(fn, p, "Consumer", "Poll", "ReadMessage") {
			return true
		}
	}
	return false
}

// dedupWords name a function that deduplicates: markProcessed,
// alreadySeen, isDuplicate, claimIdempotencyKey, recordInInbox. A call of
// one (of any package: a repository in another package the analyzer
// cannot see into) counts as a dedup.
var dedupWords = []string{"dedup", "processed", "seen", "duplicate", "idempot", "inbox"}

func dedupName(name string) bool {
	l := strings.ToLower(name)
	for _, w := range dedupWords {
		if strings.Contains(l, w) {
			return true
		}
	}
	return false
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

// derivedCalls returns the functions and methods of the package that body
// calls with something derived from a Kafka record: a value of a record
// type, a variable assigned from one (o, err := decode(m.Value)), one a
// call given a record fills in (json.Unmarshal(m.Value, &o)), a field of
// either; the variables of params (a function the records reached: its
// parameters are theirs) count as records. Neither a length (len(recs)),
// an error nor a context is derived: what is handed a count or a decoding
// error is not applying the record.
func derivedCalls(pass *analysis.Pass, body *ast.BlockStmt, params *types.Func) []*types.Func {
	info := pass.TypesInfo
	tainted := make(map[types.Object]bool)
	if params != nil {
		if sig, ok := params.Type().(*types.Signature); ok {
			for v := range sig.Params().Variables() {
				if carriesRecord(v.Type()) {
					tainted[v] = true
				}
			}
		}
	}
	mentions := func(e ast.Node) bool {
		found := false
		ast.Inspect(e, func(n ast.Node) bool {
			if found {
				return false
			}
			switch n := n.(type) {
			case *ast.CallExpr:
				if isBuiltin(info, n, "len") || isBuiltin(info, n, "cap") {
					return false
				}
			case *ast.Ident:
				if obj := info.ObjectOf(n); obj != nil && tainted[obj] {
					found = true
				}
			}
			if e, ok := n.(ast.Expr); ok && isKafkaRecord(info.TypeOf(e)) {
				found = true
			}
			return !found
		})
		return found
	}
	taint := func(e ast.Expr) bool {
		id := rootIdent(e)
		if id == nil {
			return false
		}
		v, ok := info.ObjectOf(id).(*types.Var)
		// Only a local variable: a field of the receiver set from a
		// record (c.last = m.Offset) does not make every method of c
		// the record's.
		if !ok || v.Kind() != types.LocalVar || tainted[v] || !carriesRecord(v.Type()) {
			return false
		}
		tainted[v] = true
		return true
	}
	// Until nothing more is derived: assignments may come in any order in
	// a loop.
	for changed := true; changed; {
		changed = false
		ast.Inspect(body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, r := range n.Rhs {
					if mentions(r) {
						for _, l := range n.Lhs {
							changed = taint(l) || changed
						}
						break
					}
				}
			case *ast.ValueSpec:
				for _, r := range n.Values {
					if mentions(r) {
						for _, id := range n.Names {
							changed = taint(id) || changed
						}
						break
					}
				}
			case *ast.RangeStmt:
				if mentions(n.X) {
					if n.Key != nil {
						changed = taint(n.Key) || changed
					}
					if n.Value != nil {
						changed = taint(n.Value) || changed
					}
				}
			case *ast.CallExpr:
				// json.Unmarshal(m.Value, &o), dec.Decode(&o),
				// proto.Unmarshal(m.Value, o): what a call given a record
				// fills in (through a pointer other than &x, only a call of
				// another package: a decoder, not the package's own
				// handler given the pool).
				if callMentions(info, n, mentions) {
					fn := callee(info, n)
					for _, a := range n.Args {
						if u, ok := ast.Unparen(a).(*ast.UnaryExpr); ok && u.Op == token.AND {
							changed = taint(u.X) || changed
						} else if _, ok := info.TypeOf(a).Underlying().(*types.Pointer); ok && fn != nil && fn.Pkg() != pass.Pkg && !mentions(a) {
							changed = taint(a) || changed
						}
					}
				}
			}
			return true
		})
	}
	var out []*types.Func
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if fn := callee(info, call); fn != nil && fn.Pkg() == pass.Pkg && callMentions(info, call, mentions) {
			out = append(out, fn)
		}
		return true
	})
	return out
}

// callMentions reports whether an argument of call, or the value whose
// method it calls (o.Apply(ctx)), is derived from a record.
func callMentions(info *types.Info, call *ast.CallExpr, mentions func(ast.Node) bool) bool {
	for _, a := range call.Args {
		if mentions(a) {
			return true
		}
	}
	if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok {
		if s, ok := info.Selections[sel]; ok && s.Kind() == types.MethodVal {
			return mentions(sel.X)
		}
	}
	return false
}

// carriesRecord reports whether a variable of type t may hold what is
// derived from a record: not an error, a context or a boolean.
func carriesRecord(t types.Type) bool {
	if t == nil {
		return false
	}
	if isType(t, "context", "Context") {
		return false
	}
	if b, ok := t.Underlying().(*types.Basic); ok && b.Kind() == types.Bool {
		return false
	}
	return !types.Identical(t, types.Universe.Lookup("error").Type())
}

// rootIdent returns the variable an assignment's left side writes to, or
// part of: o in o, o.Amount, o.Items[i], *o.
func rootIdent(e ast.Expr) *ast.Ident {
	for {
		switch x := ast.Unparen(e).(type) {
		case *ast.Ident:
			if x.Name == "_" {
				return nil
			}
			return x
		case *ast.SelectorExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		default:
			return nil
		}
	}
}

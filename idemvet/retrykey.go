package idemvet

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"slices"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// RetryKey reports idempotency keys and event IDs created inside a retry
// loop that also sends the operation.
var RetryKey = &analysis.Analyzer{
	Name: "idemretrykey",
	Doc:  "report an Idempotency-Key or event ID created inside the retry loop that sends it",
	Run:  runRetryKey,
}

const (
	msgRetryKey       = "idempotency key created inside a retry loop: create it once per operation, before the loop"
	msgRetryKeyHelper = "idempotency key created inside a retry loop (by %s): create it once per operation, before the loop, and set it on every attempt's request"
)

// workMethods are methods that take the next unit of work; a loop calling
// one handles one operation per iteration and is not a retry loop.
var workMethods = []string{"Recv", "Receive", "PollFetches", "PollRecords", "Accept", "ReadMessage", "FetchMessage", "ReadString", "ReadLine", "ReadBytes"}

func runRetryKey(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	assigns := assignments(pass)
	var fields map[types.Object][]assignment // built on first use
	helpers := newSendHelpers(pass)
	funcs := funcResults(pass)
	r := newReporter(pass)
	for _, f := range sourceFiles(pass) {
		labels := make(map[ast.Stmt]*ast.Ident) // a loop's label
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			loop := n // the retry loop, or the operation a retry library runs
			switch n := n.(type) {
			case *ast.LabeledStmt:
				labels[n.Stmt] = n.Label
				return true
			case *ast.ForStmt:
				body = n.Body
			case *ast.RangeStmt:
				body = n.Body
			case *ast.CallExpr:
				op := retryOperation(info, assigns, n)
				if op == nil {
					return true
				}
				loop, body = op, op.Body
			default:
				return true
			}
			if _, ok := loop.(*ast.FuncLit); !ok && (!isRetryLoop(info, assigns, n) || !stopsOnSuccess(info, funcs, n.(ast.Stmt), labels[n.(ast.Stmt)])) {
				return true
			}
			var (
				keys      []*ast.CallExpr
				keyValues []ast.Expr // values the loop sends as an Idempotency-Key
				sends     bool
				fresh     []*ast.CallExpr // calls of a helper that makes a new key
				idValues  []assignment    // values the loop stores as an event ID
			)
			ast.Inspect(body, func(m ast.Node) bool {
				switch m := m.(type) {
				case *ast.CompositeLit: // orderPlaced{EventID: ...}
					st := structOf(info.TypeOf(m))
					for i, el := range m.Elts {
						var field *types.Var
						if kv, ok := el.(*ast.KeyValueExpr); ok {
							if id, ok := kv.Key.(*ast.Ident); ok {
								field, _ = info.ObjectOf(id).(*types.Var)
							}
							el = kv.Value
						} else if st != nil && i < st.NumFields() {
							field = st.Field(i)
						}
						if field != nil && field.IsField() && isEventIDField(field) {
							idValues = append(idValues, assignment{el, 0})
						}
					}
				case *ast.AssignStmt: // e.ID, _ = uuid.NewV7()
					for i, l := range m.Lhs {
						sel, ok := ast.Unparen(l).(*ast.SelectorExpr)
						if !ok {
							continue
						}
						field, _ := info.ObjectOf(sel.Sel).(*types.Var)
						if field == nil || !field.IsField() || !isEventIDField(field) {
							continue
						}
						switch {
						case len(m.Lhs) == len(m.Rhs):
							idValues = append(idValues, assignment{m.Rhs[i], 0})
						case len(m.Rhs) == 1:
							idValues = append(idValues, assignment{m.Rhs[0], i})
						}
					}
				}
				call, ok := m.(*ast.CallExpr)
				if !ok {
					return true
				}
				if isSend(info, call) {
					sends = true
				}
				if v := keyHeaderValue(info, call); v != nil {
					sends = true
					keyValues = append(keyValues, v)
				}
				// A function of the package that sends, or sets one of
				// its parameters as the key.
				if h := helpers.of(callee(info, call), 0); h != nil {
					sends = sends || h.sends
					for _, i := range h.keyParams {
						if i < len(call.Args) {
							sends = true
							keyValues = append(keyValues, call.Args[i])
						}
					}
					if h.freshKey && !inNestedLoop(body, call) {
						fresh = append(fresh, call)
					}
				}
				if newKey(info, call) != notKey && !inNestedLoop(body, call) {
					keys = append(keys, call)
				}
				return true
			})
			// A helper that stamps the request with a new key, when the
			// loop sets none itself (which would replace it).
			if sends && len(keyValues) == 0 {
				for _, c := range fresh {
					r.report(c, fmt.Sprintf(msgRetryKeyHelper, callee(info, c).Name()))
				}
			}
			var trace *uuidTracer // the UUID constructors whose value is a key
			var ids *uuidTracer   // the UUID constructors whose value is an event ID
			for _, k := range keys {
				switch newKey(info, k) {
				case idemKey:
					if sends {
						r.report(k, msgRetryKey)
					}
				case plainUUID:
					// A plain UUID may be a per-attempt request or trace
					// ID; it counts only when it becomes the key, or,
					// when a key's value cannot be followed, whenever the
					// loop sets a key.
					if trace == nil {
						if fields == nil {
							fields = fieldAssignments(pass)
						}
						trace = &uuidTracer{info: info, loop: loop.Pos(), body: body, decls: helpers.decls,
							assigns: assigns, fields: fields,
							seen: make(map[types.Object]bool), out: make(map[*ast.CallExpr]bool)}
						for _, v := range keyValues {
							trace.uuidSources(v, 0, 0)
						}
					}
					if trace.out[k] || trace.opaque {
						r.report(k, msgRetryKey)
						break
					}
					// An event ID (an EventID field, event.Envelope's ID)
					// made on every attempt of a loop that sends: every
					// retry is a new event to the consumers' dedup. Only a
					// UUID followed to the ID counts.
					if !sends || len(idValues) == 0 {
						break
					}
					if ids == nil {
						if fields == nil {
							fields = fieldAssignments(pass)
						}
						ids = &uuidTracer{info: info, loop: loop.Pos(), body: body, decls: helpers.decls,
							assigns: assigns, fields: fields,
							seen: make(map[types.Object]bool), out: make(map[*ast.CallExpr]bool)}
						for _, v := range idValues {
							ids.uuidSources(v.Expr, v.Index, 0)
						}
					}
					if ids.out[k] {
						r.report(k, msgRetryKey)
					}
				}
			}
			return true
		})
	}
	return nil, nil
}

// retryLibraries are the retry functions of retry packages (by import path
// prefix, so that every major version counts) that run an operation, a
// function argument, once per attempt.
var retryLibraries = []struct {
	path  string
	funcs []string
}{
	{"github.com/cenkalti/backoff", []string{"Retry", "RetryNotify", "RetryWithData", "RetryNotifyWithData", "RetryNotifyWithTimer", "RetryNotifyWithTimerAndData"}},
	{"github.com/avast/retry-go", []string{"Do", "DoWithData"}},
	{"github.com/sethvargo/go-retry", []string{"Do", "DoValue", "Constant", "Exponential", "Fibonacci"}},
}

// retryOperation returns the operation a call of a retry library's retry
// function runs once per attempt: the argument of its first parameter of a
// function type (not one of an interface a function may satisfy, such as
// go-retry's Backoff given a BackoffFunc), a function literal or a
// variable assigned one once; nil for any other call.
func retryOperation(info *types.Info, assigns map[types.Object][]assignment, call *ast.CallExpr) *ast.FuncLit {
	fn := callee(info, call)
	if fn == nil || fn.Pkg() == nil {
		return nil
	}
	sig := fn.Type().(*types.Signature)
	if sig.Recv() != nil {
		return nil
	}
	lib := false
	for _, l := range retryLibraries {
		path := fn.Pkg().Path()
		if (path == l.path || strings.HasPrefix(path, l.path+"/")) && contains(l.funcs, fn.Name()) {
			lib = true
		}
	}
	if !lib {
		return nil
	}
	for i, a := range call.Args {
		if i >= sig.Params().Len() {
			break
		}
		if _, ok := sig.Params().At(i).Type().Underlying().(*types.Signature); !ok {
			continue // a variadic parameter's type is a slice
		}
		switch a := ast.Unparen(a).(type) {
		case *ast.FuncLit:
			return a
		case *ast.Ident:
			if as := assigns[info.ObjectOf(a)]; len(as) == 1 {
				lit, _ := ast.Unparen(as[0].Expr).(*ast.FuncLit)
				return lit
			}
		}
		return nil
	}
	return nil
}

// sendHelper is what a function of the package does with a request: sends
// it (directly or through another function of the package), and which of
// its parameters it sets as the Idempotency-Key.
type sendHelper struct {
	sends     bool
	keyParams []int
	// freshKey is set when it sets the key to one it makes on every
	// call (req.Header.Set("Idempotency-Key", uuid.NewString()) in an
	// API client's request helper), itself or through another function
	// of the package, and does not keep a key the request already has.
	freshKey bool
}

// sendHelpers finds the functions of the package that send.
type sendHelpers struct {
	pass  *analysis.Pass
	info  *types.Info
	decls map[*types.Func]*ast.FuncDecl
	done  map[*types.Func]*sendHelper // nil while in progress
	// assigns and fields are built on first use (a helper that sets a
	// key).
	assigns, fields map[types.Object][]assignment
}

func newSendHelpers(pass *analysis.Pass) *sendHelpers {
	h := &sendHelpers{pass: pass, info: pass.TypesInfo, decls: make(map[*types.Func]*ast.FuncDecl), done: make(map[*types.Func]*sendHelper)}
	for _, f := range pass.Files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				if fn, ok := pass.TypesInfo.Defs[fd.Name].(*types.Func); ok {
					h.decls[fn] = fd
				}
			}
		}
	}
	return h
}

// of returns what fn, a function of the package, does with a request, or
// nil when fn is not one or neither sends nor sets a key. depth bounds the
// search through functions that call others.
func (h *sendHelpers) of(fn *types.Func, depth int) *sendHelper {
	decl := h.decls[fn]
	if decl == nil || depth > 4 {
		return nil
	}
	if s, ok := h.done[fn]; ok {
		return s // nil while in progress: a recursive call adds nothing
	}
	h.done[fn] = nil
	params := make(map[types.Object]int)
	if sig, ok := fn.Type().(*types.Signature); ok {
		for i := range sig.Params().Len() {
			params[sig.Params().At(i)] = i
		}
	}
	s := &sendHelper{}
	var keys []ast.Expr // the values it sets as the key
	keepsKey := false   // it reads the key the request has
	addParam := func(e ast.Expr) {
		if id, ok := ast.Unparen(e).(*ast.Ident); ok {
			if i, ok := params[h.info.Uses[id]]; ok && !slices.Contains(s.keyParams, i) {
				s.keyParams = append(s.keyParams, i)
			}
		}
	}
	ast.Inspect(decl.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if isSend(h.info, call) {
			s.sends = true
		}
		if v := keyHeaderValue(h.info, call); v != nil {
			s.sends = true
			addParam(v)
			keys = append(keys, v)
		}
		if readsKeyHeader(h.info, call) {
			keepsKey = true
		}
		if g := h.of(callee(h.info, call), depth+1); g != nil {
			s.sends = s.sends || g.sends
			s.freshKey = s.freshKey || g.freshKey
			for _, i := range g.keyParams {
				if i < len(call.Args) {
					s.sends = true
					addParam(call.Args[i])
				}
			}
		}
		return true
	})
	if len(keys) > 0 && !s.freshKey {
		s.freshKey = h.makesKey(decl, keys)
	}
	if keepsKey {
		s.freshKey = false // a default for a request without a key
	}
	if !s.sends {
		s = nil
	}
	h.done[fn] = s
	return s
}

// makesKey reports whether one of keys, the values decl sets as the key,
// is computed from a UUID, key or event ID constructor called in decl's
// body (not one stored in a field by a constructor run once), and all of
// it can be followed.
func (h *sendHelpers) makesKey(decl *ast.FuncDecl, keys []ast.Expr) bool {
	if h.assigns == nil {
		h.assigns, h.fields = assignments(h.pass), fieldAssignments(h.pass)
	}
	t := &uuidTracer{info: h.info, loop: decl.Body.Pos(), body: decl.Body, decls: h.decls,
		assigns: h.assigns, fields: h.fields,
		seen: make(map[types.Object]bool), out: make(map[*ast.CallExpr]bool)}
	for _, k := range keys {
		t.uuidSources(k, 0, 0)
	}
	if t.opaque {
		return false
	}
	for c := range t.out {
		if decl.Body.Pos() <= c.Pos() && c.End() <= decl.Body.End() {
			return true
		}
	}
	return false
}

// readsKeyHeader reports whether call reads a request's Idempotency-Key
// (or X-Idempotency-Key) header: Header.Get or Values.
func readsKeyHeader(info *types.Info, call *ast.CallExpr) bool {
	if !isMethod(callee(info, call), httpPath, "Header", "Get", "Values") || len(call.Args) != 1 {
		return false
	}
	name, ok := constString(info, call.Args[0])
	return ok && (strings.EqualFold(name, "Idempotency-Key") || strings.EqualFold(name, "X-Idempotency-Key"))
}

// keyKind classifies a call that makes a fresh identifier.
type keyKind int

const (
	notKey    keyKind = iota
	plainUUID         // a github.com/google/uuid constructor
	idemKey           // an idem key or event ID constructor
)

// uuidConstructors are the functions of github.com/google/uuid that make a
// new UUID on every call (NewMD5, NewSHA1 and Parse do not).
var uuidConstructors = []string{
	"New", "NewString", "NewRandom", "NewRandomFromReader", // version 4
	"NewUUID",                                       // version 1
	"NewDCESecurity", "NewDCEPerson", "NewDCEGroup", // version 2
	"NewV6", "NewV7", "NewV7FromReader",
}

// gofrsUUIDConstructors are the functions of github.com/gofrs/uuid that
// make a new UUID on every call (NewV3 and NewV5 derive one from a name).
var gofrsUUIDConstructors = []string{"NewV1", "NewV4", "NewV6", "NewV7"}

// newKey classifies call by the identifier it makes.
func newKey(info *types.Info, call *ast.CallExpr) keyKind {
	fn := callee(info, call)
	switch {
	case isFunc(fn, eventPath, "NewID", "New"),
		isFunc(fn, idemclientPath, "NewKey"),
		isMethod(fn, idemclientPath, "Client", "NewKey"):
		return idemKey
	case isFunc(fn, uuidPath, uuidConstructors...),
		isFuncIn(fn, gofrsUUIDPaths, gofrsUUIDConstructors...):
		return plainUUID
	}
	return notKey
}

// isSend reports whether call sends an HTTP request or a Kafka record
// (franz-go, kafka-go's Writer, sarama's producers, confluent-kafka-go).
func isSend(info *types.Info, call *ast.CallExpr) bool {
	fn := callee(info, call)
	if isFunc(fn, httpPath, "Post", "PostForm", "Get", "Head") ||
		isMethod(fn, httpPath, "Client", "Do", "Post", "PostForm", "Get", "Head") ||
		isMethod(fn, httpPath, "RoundTripper", "RoundTrip") ||
		isMethod(fn, idemclientPath, "Client", "Do") ||
		isMethod(fn, kgoPath, "Client", "Produce", "ProduceSync", "TryProduce") ||
		isMethod(fn, kafkagoPath, "Writer", "WriteMessages") {
		return true
	}
	for _, p := range saramaPaths {
		if isMethod(fn, p, "SyncProducer", "SendMessage", "SendMessages") {
			return true
		}
	}
	for _, p := range confluentPaths {
		if isMethod(fn, p, "Producer", "Produce") {
			return true
		}
	}
	return false
}

// keyHeaderValue returns the key that call attaches to a request as its
// Idempotency-Key: the key of idemclient.WithKey, or the value of a Set or
// Add of the header (Idempotency-Key, or X-Idempotency-Key as some payment
// APIs name it). It returns nil for any other call.
func keyHeaderValue(info *types.Info, call *ast.CallExpr) ast.Expr {
	fn := callee(info, call)
	if isFunc(fn, idemclientPath, "WithKey") && len(call.Args) == 2 {
		return call.Args[1]
	}
	if !isMethod(fn, httpPath, "Header", "Set", "Add") || len(call.Args) != 2 {
		return nil
	}
	if name, ok := constString(info, call.Args[0]); ok && (strings.EqualFold(name, "Idempotency-Key") || strings.EqualFold(name, "X-Idempotency-Key")) {
		return call.Args[1]
	}
	return nil
}

// uuidTracer finds the github.com/google/uuid constructor calls a value is
// computed from.
type uuidTracer struct {
	info    *types.Info
	loop    token.Pos                     // the retry loop
	body    *ast.BlockStmt                // the retry loop's body
	decls   map[*types.Func]*ast.FuncDecl // the functions of the package
	assigns map[types.Object][]assignment // to variables
	fields  map[types.Object][]assignment // to struct fields and qualified variables
	seen    map[types.Object]bool
	out     map[*ast.CallExpr]bool // the constructors found
	// opaque is set when part of a value cannot be followed and may come
	// from the loop: an element of a map or slice, a dereference, a
	// composite literal, a function literal, a parameter of a function
	// literal or of a function of the package the loop calls (a setter),
	// a chain of variables too long. A field nothing in the package
	// assigns (filled by rows.Scan, a decoder, another package) and a
	// parameter of a function the loop does not call hold a value made
	// before the loop: a stored key.
	opaque bool
	called map[*types.Scope]bool // the scopes of the functions the loop calls; built on first use
}

// uuidSources adds to t.out the constructor calls whose value e is or is
// computed from: the call itself, the receiver or an argument of a call
// (id.String(), uuid.Must(...), fmt.Sprint(id)), either side of a binary
// expression, the operand of an index or slice expression (id[:],
// id.String()[:8]) or of a type assertion, or a value assigned to a
// variable or a struct field (o.key = ..., opts{key: ...}). index is the
// result of e wanted when e is a call; depth bounds the search through
// variables and fields.
func (t *uuidTracer) uuidSources(e ast.Expr, index, depth int) {
	if depth > 8 {
		t.opaque = true
		return
	}
	info := t.info
	switch e := ast.Unparen(e).(type) {
	case *ast.BasicLit:
	case *ast.CallExpr:
		if newKey(info, e) != notKey {
			if index == 0 {
				t.out[e] = true
			}
			return
		}
		switch fun := ast.Unparen(e.Fun).(type) {
		case *ast.SelectorExpr:
			if s, ok := info.Selections[fun]; ok && s.Kind() == types.MethodVal {
				t.uuidSources(fun.X, 0, depth)
			}
		case *ast.FuncLit:
			t.opaque = true // what it returns is not followed
		}
		for _, a := range e.Args {
			t.uuidSources(a, 0, depth)
		}
	case *ast.BinaryExpr:
		t.uuidSources(e.X, 0, depth)
		t.uuidSources(e.Y, 0, depth)
	case *ast.IndexExpr:
		t.element(e.X, depth)
	case *ast.SliceExpr:
		t.element(e.X, depth)
	case *ast.TypeAssertExpr:
		t.uuidSources(e.X, 0, depth)
	case *ast.Ident:
		obj, ok := info.ObjectOf(e).(*types.Var)
		if !ok || t.seen[obj] {
			return
		}
		t.seen[obj] = true
		switch obj.Kind() {
		case types.ParamVar, types.RecvVar, types.ResultVar:
			// A parameter of the function holding the loop comes from
			// before the loop, as does one of a function of the package
			// the loop does not call (a constructor run before it). One
			// of a function the loop calls (a setter that stores it in a
			// field) or of a function literal comes from callers not
			// followed.
			if obj.Parent() == nil || !obj.Parent().Contains(t.loop) && t.fromLoop(obj.Parent()) {
				t.opaque = true
			}
		}
		for _, a := range t.assigns[obj] {
			t.uuidSources(a.Expr, a.Index, depth+1)
		}
	case *ast.SelectorExpr:
		if s, ok := info.Selections[e]; ok && s.Kind() != types.FieldVal {
			t.opaque = true // a method value
			return
		}
		obj, ok := info.Uses[e.Sel].(*types.Var)
		if !ok {
			return // a constant
		}
		if t.seen[obj] {
			return
		}
		t.seen[obj] = true
		// A field nothing in the package assigns is loaded: by rows.Scan,
		// a decoder, another package. It holds a stored key, not one made
		// by the loop.
		for _, a := range t.fields[obj] {
			t.uuidSources(a.Expr, a.Index, depth+1)
		}
	default:
		t.opaque = true
	}
}

// fromLoop reports whether the parameters of scope, a function's, may be
// set by the loop: scope is not that of a function declared in the package
// (a function literal's), or the loop calls the function, directly or
// through others of the package.
func (t *uuidTracer) fromLoop(scope *types.Scope) bool {
	if t.called == nil {
		t.called = make(map[*types.Scope]bool)
		var visit func(n ast.Node, depth int)
		visit = func(n ast.Node, depth int) {
			ast.Inspect(n, func(m ast.Node) bool {
				call, ok := m.(*ast.CallExpr)
				if !ok {
					return true
				}
				d := t.decls[callee(t.info, call)]
				if d == nil {
					return true
				}
				s := t.info.Scopes[d.Type]
				if s == nil || t.called[s] {
					return true
				}
				t.called[s] = true
				if depth < 4 {
					visit(d.Body, depth+1)
				}
				return true
			})
		}
		visit(t.body, 0)
	}
	if t.called[scope] {
		return true
	}
	for _, d := range t.decls {
		if t.info.Scopes[d.Type] == scope {
			return false
		}
	}
	return true
}

// element follows the operand x of an index or slice expression. Stores
// to the elements of a map or slice are not followed, so x of such a type
// makes the value opaque.
func (t *uuidTracer) element(x ast.Expr, depth int) {
	if tv, ok := t.info.Types[x]; ok && tv.Type != nil {
		switch tv.Type.Underlying().(type) {
		case *types.Map, *types.Slice, *types.Pointer:
			t.opaque = true
		}
	}
	t.uuidSources(x, 0, depth)
}

// fieldAssignments maps every struct field, and every variable of another
// package, to the values the package assigns to it: x.f = v, pkg.V = v,
// and the elements of struct composite literals (T{f: v}, T{v}).
func fieldAssignments(pass *analysis.Pass) map[types.Object][]assignment {
	info := pass.TypesInfo
	m := make(map[types.Object][]assignment)
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for i, l := range n.Lhs {
					sel, ok := ast.Unparen(l).(*ast.SelectorExpr)
					if !ok {
						continue
					}
					obj, ok := info.Uses[sel.Sel].(*types.Var)
					if !ok {
						continue
					}
					switch {
					case len(n.Lhs) == len(n.Rhs):
						m[obj] = append(m[obj], assignment{n.Rhs[i], 0})
					case len(n.Rhs) == 1:
						m[obj] = append(m[obj], assignment{n.Rhs[0], i})
					}
				}
			case *ast.CompositeLit:
				tv, ok := info.Types[n]
				if !ok || tv.Type == nil {
					return true
				}
				t := tv.Type.Underlying()
				if p, ok := t.(*types.Pointer); ok {
					t = p.Elem().Underlying()
				}
				st, ok := t.(*types.Struct)
				if !ok {
					return true
				}
				for i, elt := range n.Elts {
					if kv, ok := elt.(*ast.KeyValueExpr); ok {
						if id, ok := kv.Key.(*ast.Ident); ok {
							if obj, ok := info.Uses[id].(*types.Var); ok {
								m[obj] = append(m[obj], assignment{kv.Value, 0})
							}
						}
					} else if i < st.NumFields() {
						m[st.Field(i)] = append(m[st.Field(i)], assignment{elt, 0})
					}
				}
			}
			return true
		})
	}
	return m
}

// isRetryLoop reports whether loop may repeat one operation: a loop over
// a count or a condition, or an endless one. Loops over the items of a
// slice, map, channel or iterator, loops whose condition is a call (rows.Next())
// or uses a len (also through a variable), a range over a len, and loops that receive or fetch the next unit of work (a
// receive from a time.Ticker's channel or time.Tick included: a periodic
// job) handle a new operation per iteration. A receive from time.After or
// a Timer is a backoff between attempts.
func isRetryLoop(info *types.Info, assigns map[types.Object][]assignment, loop ast.Node) bool {
	var body *ast.BlockStmt
	switch l := loop.(type) {
	case *ast.RangeStmt:
		x := info.TypeOf(l.X)
		if x == nil {
			return false
		}
		t, ok := x.Underlying().(*types.Basic)
		if !ok || t.Info()&types.IsInteger == 0 {
			return false
		}
		if usesLen(info, assigns, l.X, 0) {
			return false // for i := range len(items)
		}
		body = l.Body
	case *ast.ForStmt:
		if l.Cond != nil {
			if _, ok := ast.Unparen(l.Cond).(*ast.CallExpr); ok {
				return false
			}
			if usesLen(info, assigns, l.Cond, 0) {
				return false
			}
		}
		body = l.Body
	}
	work := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.AssignStmt:
			// v := <-ch, v, ok = <-ch (in a select case too)
			for _, rhs := range n.Rhs {
				if u, ok := ast.Unparen(rhs).(*ast.UnaryExpr); ok && u.Op == token.ARROW && !allBlank(n.Lhs) {
					work = true
				}
			}
		case *ast.UnaryExpr:
			// <-t.C, <-time.Tick(d), in a select case too
			if n.Op == token.ARROW && isTickerChan(info, assigns, n.X, 0) {
				work = true
			}
		case *ast.CallExpr:
			if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok && contains(workMethods, sel.Sel.Name) {
				if _, isMeth := info.Selections[sel]; isMeth {
					work = true
				}
			}
		}
		return !work
	})
	return !work
}

// usesLen reports whether e calls len or cap, directly or through a
// variable every assignment of which does (n := len(items); i < n): a
// bound that counts items. depth bounds the search through variables.
func usesLen(info *types.Info, assigns map[types.Object][]assignment, e ast.Expr, depth int) bool {
	if depth > 2 {
		return false
	}
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if isBuiltin(info, n, "len") || isBuiltin(info, n, "cap") {
				found = true
			}
		case *ast.Ident:
			v, ok := info.Uses[n].(*types.Var)
			if !ok || len(assigns[v]) == 0 {
				return true
			}
			all := true
			for _, a := range assigns[v] {
				if a.Index != 0 || !usesLen(info, assigns, a.Expr, depth+1) {
					all = false
					break
				}
			}
			found = all
		}
		return !found
	})
	return found
}

// isTickerChan reports whether e is the channel of a time.Ticker or one
// from time.Tick, directly or through a variable; depth bounds the search
// through variables.
func isTickerChan(info *types.Info, assigns map[types.Object][]assignment, e ast.Expr, depth int) bool {
	if depth > 8 {
		return false
	}
	switch e := ast.Unparen(e).(type) {
	case *ast.SelectorExpr:
		s, ok := info.Selections[e]
		if !ok || s.Kind() != types.FieldVal {
			return false
		}
		v, _ := s.Obj().(*types.Var)
		return isField(v, timePath, "Ticker", "C")
	case *ast.CallExpr:
		return isFunc(callee(info, e), timePath, "Tick")
	case *ast.Ident:
		obj, ok := info.ObjectOf(e).(*types.Var)
		if !ok {
			return false
		}
		for _, a := range assigns[obj] {
			if a.Index == 0 && isTickerChan(info, assigns, a.Expr, depth+1) {
				return true
			}
		}
	}
	return false
}

func allBlank(es []ast.Expr) bool {
	for _, e := range es {
		if id, ok := e.(*ast.Ident); !ok || id.Name != "_" {
			return false
		}
	}
	return true
}

// inNestedLoop reports whether n is inside a loop nested in body; that loop
// is judged on its own.
func inNestedLoop(body *ast.BlockStmt, n ast.Node) bool {
	nested := false
	ast.Inspect(body, func(m ast.Node) bool {
		if nested || m == nil {
			return false
		}
		switch m.(type) {
		case *ast.ForStmt, *ast.RangeStmt:
			if m.Pos() <= n.Pos() && n.End() <= m.End() {
				nested = true
			}
			return false
		}
		return m.Pos() <= n.Pos() && n.End() <= m.End()
	})
	return nested
}

// stopsOnSuccess reports whether loop may stop before its count or
// condition runs out, other than on a failure: a retry loop stops once an
// attempt succeeded, while a loop that makes one operation per count runs
// every count and leaves early only when one fails. An exit is a return, a
// break of the loop (label, if any, is its label), a goto or a labelled
// branch out of it, or a condition that reads a variable the body or post
// statement sets (other than a counter stepped by ++, --, += or -=:
// done = true, err = ...). A failure exit is one in the then branch of an
// if, or in a case of a switch without a tag, whose condition tests an
// error against nil (err != nil, ctx.Err() != nil) or calls errors.Is or
// errors.As, one in a select case that receives from a context's Done
// channel (cancelled), and a return of an error other than nil or a local
// variable (fmt.Errorf(...), a sentinel). Function literals are not
// looked into.
func stopsOnSuccess(info *types.Info, funcs map[*types.Scope]*types.Tuple, loop ast.Stmt, label *ast.Ident) bool {
	var body *ast.BlockStmt
	switch l := loop.(type) {
	case *ast.ForStmt:
		body = l.Body
		if l.Cond != nil && condSetIn(info, l.Cond, l.Body, l.Post) {
			return true
		}
	case *ast.RangeStmt:
		body = l.Body
	default:
		return true
	}
	var own *types.Label
	if label != nil {
		own, _ = info.Defs[label].(*types.Label)
	}
	inside := func(id *ast.Ident) bool {
		obj := info.Uses[id]
		return obj != nil && body.Pos() <= obj.Pos() && obj.Pos() < body.End()
	}
	results := enclosingResults(info, funcs, body)
	success := false
	// walk visits n; failure: n runs only after a failure; nested: an
	// unlabelled break in n ends a statement inside the loop.
	var walk func(n ast.Node, failure, nested bool)
	walk = func(n ast.Node, failure, nested bool) {
		if n == nil || success {
			return
		}
		ast.Inspect(n, func(m ast.Node) bool {
			if success {
				return false
			}
			switch m := m.(type) {
			case *ast.FuncLit:
				return false
			case *ast.IfStmt:
				walk(m.Init, failure, nested)
				walk(m.Body, failure || testsFailure(info, m.Cond), nested)
				walk(m.Else, failure, nested)
				return false
			case *ast.ForStmt, *ast.RangeStmt, *ast.SwitchStmt, *ast.TypeSwitchStmt, *ast.SelectStmt:
				if m == n {
					return true
				}
				walk(m, failure, true)
				return false
			case *ast.CaseClause:
				// A case of a switch without a tag runs after a failure
				// if each of its expressions tests one.
				f := len(m.List) > 0
				for _, e := range m.List {
					f = f && testsFailure(info, e)
				}
				f = f || failure
				for _, st := range m.Body {
					walk(st, f, nested)
				}
				return false
			case *ast.CommClause:
				f := failure || receivesDone(info, m.Comm)
				for _, st := range m.Body {
					walk(st, f, nested)
				}
				return false
			case *ast.ReturnStmt:
				if !failure && !returnsError(info, m, results) {
					success = true
				}
			case *ast.BranchStmt:
				exit := false
				switch {
				case m.Label != nil && m.Tok == token.CONTINUE:
					l, _ := info.Uses[m.Label].(*types.Label)
					exit = l != own && !inside(m.Label)
				case m.Label != nil:
					exit = !inside(m.Label) // break L, goto L
				case m.Tok == token.BREAK:
					exit = !nested
				}
				if exit && !failure {
					success = true
				}
			}
			return true
		})
	}
	walk(body, false, false)
	return success
}

// condSetIn reports whether cond reads a variable that body or post sets,
// other than a counter stepped by ++, --, += or -=.
func condSetIn(info *types.Info, cond ast.Expr, body *ast.BlockStmt, post ast.Stmt) bool {
	read := make(map[types.Object]bool)
	ast.Inspect(cond, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			if v, ok := info.Uses[id].(*types.Var); ok {
				read[v] = true
			}
		}
		return true
	})
	set := false
	check := func(n ast.Node) {
		if n == nil {
			return
		}
		ast.Inspect(n, func(m ast.Node) bool {
			switch m := m.(type) {
			case *ast.AssignStmt:
				if m.Tok == token.ADD_ASSIGN || m.Tok == token.SUB_ASSIGN {
					return true
				}
				for _, l := range m.Lhs {
					if id, ok := ast.Unparen(l).(*ast.Ident); ok && read[info.ObjectOf(id)] {
						set = true
					}
				}
			case *ast.UnaryExpr:
				if m.Op == token.AND { // &done, set elsewhere
					if id, ok := ast.Unparen(m.X).(*ast.Ident); ok && read[info.ObjectOf(id)] {
						set = true
					}
				}
			}
			return !set
		})
	}
	check(body)
	check(post)
	return set
}

var errorType = types.Universe.Lookup("error").Type().Underlying().(*types.Interface)

func isError(t types.Type) bool {
	return t != nil && types.Implements(t, errorType)
}

// testsFailure reports whether cond holds only after a failure: it
// compares an error not equal to nil (err != nil, ctx.Err() != nil) or
// calls errors.Is or errors.As, as a whole or in one operand of && or in
// both of ||.
func testsFailure(info *types.Info, cond ast.Expr) bool {
	switch e := ast.Unparen(cond).(type) {
	case *ast.BinaryExpr:
		switch e.Op {
		case token.LAND:
			return testsFailure(info, e.X) || testsFailure(info, e.Y)
		case token.LOR:
			return testsFailure(info, e.X) && testsFailure(info, e.Y)
		case token.NEQ:
			return isNil(info, e.Y) && isError(info.TypeOf(e.X)) || isNil(info, e.X) && isError(info.TypeOf(e.Y))
		}
	case *ast.CallExpr:
		return isFunc(callee(info, e), "errors", "Is", "As")
	}
	return false
}

func isNil(info *types.Info, e ast.Expr) bool {
	id, ok := ast.Unparen(e).(*ast.Ident)
	return ok && info.Uses[id] == types.Universe.Lookup("nil")
}

// receivesDone reports whether comm, a select case, receives from the Done
// channel of a context.
func receivesDone(info *types.Info, comm ast.Stmt) bool {
	var x ast.Expr
	switch c := comm.(type) {
	case *ast.ExprStmt:
		x = c.X
	case *ast.AssignStmt:
		if len(c.Rhs) == 1 {
			x = c.Rhs[0]
		}
	}
	u, ok := ast.Unparen(x).(*ast.UnaryExpr)
	if !ok || u.Op != token.ARROW {
		return false
	}
	call, ok := ast.Unparen(u.X).(*ast.CallExpr)
	return ok && isMethod(callee(info, call), "context", "Context", "Done")
}

// funcResults maps the scope of every function (declaration or literal)
// to its result types.
func funcResults(pass *analysis.Pass) map[*types.Scope]*types.Tuple {
	info := pass.TypesInfo
	m := make(map[*types.Scope]*types.Tuple)
	add := func(ft *ast.FuncType, t types.Type) {
		if sig, ok := t.(*types.Signature); ok && info.Scopes[ft] != nil {
			m[info.Scopes[ft]] = sig.Results()
		}
	}
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if fn := info.Defs[n.Name]; fn != nil {
					add(n.Type, fn.Type())
				}
			case *ast.FuncLit:
				add(n.Type, info.TypeOf(n))
			}
			return true
		})
	}
	return m
}

// enclosingResults returns the result types of the innermost function
// around body, a loop's.
func enclosingResults(info *types.Info, funcs map[*types.Scope]*types.Tuple, body *ast.BlockStmt) *types.Tuple {
	for s := info.Scopes[body]; s != nil; s = s.Parent() {
		if r, ok := funcs[s]; ok {
			return r
		}
	}
	return nil
}

// returnsError reports whether ret returns a new error or a sentinel:
// fmt.Errorf(...), errors.New(...), errors.Join(...), a variable of a
// package, or a composite literal (&MyError{...}). nil, a local variable
// (err, nil after err == nil) and what other calls return (resp.Body.Close())
// may be a success.
func returnsError(info *types.Info, ret *ast.ReturnStmt, results *types.Tuple) bool {
	if results == nil || len(ret.Results) != results.Len() {
		return false // a bare return, or a call returning several values
	}
	for i, e := range ret.Results {
		if !isError(results.At(i).Type()) {
			continue
		}
		switch e := ast.Unparen(e).(type) {
		case *ast.CallExpr:
			if isFunc(callee(info, e), "fmt", "Errorf") || isFunc(callee(info, e), "errors", "New", "Join") {
				return true
			}
		case *ast.UnaryExpr:
			if _, ok := ast.Unparen(e.X).(*ast.CompositeLit); ok && e.Op == token.AND {
				return true
			}
		case *ast.CompositeLit:
			return true
		case *ast.Ident, *ast.SelectorExpr:
			var id *ast.Ident
			if sel, ok := e.(*ast.SelectorExpr); ok {
				id = sel.Sel
			} else {
				id = e.(*ast.Ident)
			}
			if v, ok := info.Uses[id].(*types.Var); ok && v.Pkg() != nil && v.Parent() == v.Pkg().Scope() {
				return true // a sentinel: ErrGaveUp, io.ErrUnexpectedEOF
			}
		}
	}
	return false
}

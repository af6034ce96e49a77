package idemvet

import (
	"go/ast"
	"go/token"
	"go/types"
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

const msgRetryKey = "idempotency key created inside a retry loop: create it once per operation, before the loop"

// workMethods are methods that take the next unit of work; a loop calling
// one handles one operation per iteration and is not a retry loop.
var workMethods = []string{"Recv", "Receive", "PollFetches", "PollRecords", "Accept", "ReadMessage", "FetchMessage", "ReadString", "ReadLine", "ReadBytes"}

func runRetryKey(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	assigns := assignments(pass)
	r := newReporter(pass)
	for _, f := range sourceFiles(pass) {
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			switch n := n.(type) {
			case *ast.ForStmt:
				body = n.Body
			case *ast.RangeStmt:
				body = n.Body
			default:
				return true
			}
			if !isRetryLoop(info, assigns, n) {
				return true
			}
			var (
				keys      []*ast.CallExpr
				keyValues []ast.Expr // values the loop sends as an Idempotency-Key
				sends     bool
			)
			ast.Inspect(body, func(m ast.Node) bool {
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
				if newKey(info, call) != notKey && !inNestedLoop(body, call) {
					keys = append(keys, call)
				}
				return true
			})
			var sent map[*ast.CallExpr]bool // UUID constructors whose value is a key
			for _, k := range keys {
				switch newKey(info, k) {
				case idemKey:
					if sends {
						r.report(k, msgRetryKey)
					}
				case plainUUID:
					// A plain UUID may be a per-attempt request or trace
					// ID; it counts only when it becomes the key.
					if sent == nil {
						sent = make(map[*ast.CallExpr]bool)
						for _, v := range keyValues {
							uuidSources(info, assigns, v, 0, 0, sent)
						}
					}
					if sent[k] {
						r.report(k, msgRetryKey)
					}
				}
			}
			return true
		})
	}
	return nil, nil
}

// keyKind classifies a call that makes a fresh identifier.
type keyKind int

const (
	notKey    keyKind = iota
	plainUUID         // a github.com/google/uuid constructor
	idemKey           // an idem key or event ID constructor
)

// newKey classifies call by the identifier it makes.
func newKey(info *types.Info, call *ast.CallExpr) keyKind {
	fn := callee(info, call)
	switch {
	case isFunc(fn, eventPath, "NewID", "New"),
		isFunc(fn, idemclientPath, "NewKey"),
		isMethod(fn, idemclientPath, "Client", "NewKey"):
		return idemKey
	case isFunc(fn, uuidPath, "New", "NewString", "NewRandom", "NewV7", "NewV6", "NewV1"):
		return plainUUID
	}
	return notKey
}

// isSend reports whether call sends an HTTP request or a Kafka record.
func isSend(info *types.Info, call *ast.CallExpr) bool {
	fn := callee(info, call)
	return isFunc(fn, httpPath, "Post", "PostForm", "Get", "Head") ||
		isMethod(fn, httpPath, "Client", "Do", "Post", "PostForm", "Get", "Head") ||
		isMethod(fn, httpPath, "RoundTripper", "RoundTrip") ||
		isMethod(fn, idemclientPath, "Client", "Do") ||
		isMethod(fn, kgoPath, "Client", "Produce", "ProduceSync", "TryProduce")
}

// keyHeaderValue returns the key that call attaches to a request as its
// Idempotency-Key: the key of idemclient.WithKey, or the value of a Set or
// Add of the header. It returns nil for any other call.
func keyHeaderValue(info *types.Info, call *ast.CallExpr) ast.Expr {
	fn := callee(info, call)
	if isFunc(fn, idemclientPath, "WithKey") && len(call.Args) == 2 {
		return call.Args[1]
	}
	if !isMethod(fn, httpPath, "Header", "Set", "Add") || len(call.Args) != 2 {
		return nil
	}
	if name, ok := constString(info, call.Args[0]); ok && strings.EqualFold(name, "Idempotency-Key") {
		return call.Args[1]
	}
	return nil
}

// uuidSources adds to out the github.com/google/uuid constructor calls
// whose value e is or is computed from: the call itself, the receiver or an
// argument of a call (id.String(), uuid.Must(...), fmt.Sprint(id)), either
// side of a binary expression, or a value assigned to a variable. index is
// the result of e wanted when e is a call; depth bounds the search through
// variables.
func uuidSources(info *types.Info, assigns map[types.Object][]assignment, e ast.Expr, index, depth int, out map[*ast.CallExpr]bool) {
	if depth > 8 {
		return
	}
	switch e := ast.Unparen(e).(type) {
	case *ast.CallExpr:
		if newKey(info, e) == plainUUID {
			if index == 0 {
				out[e] = true
			}
			return
		}
		if sel, ok := ast.Unparen(e.Fun).(*ast.SelectorExpr); ok {
			if s, ok := info.Selections[sel]; ok && s.Kind() == types.MethodVal {
				uuidSources(info, assigns, sel.X, 0, depth+1, out)
			}
		}
		for _, a := range e.Args {
			uuidSources(info, assigns, a, 0, depth+1, out)
		}
	case *ast.BinaryExpr:
		uuidSources(info, assigns, e.X, 0, depth+1, out)
		uuidSources(info, assigns, e.Y, 0, depth+1, out)
	case *ast.Ident:
		obj, ok := info.ObjectOf(e).(*types.Var)
		if !ok {
			return
		}
		for _, a := range assigns[obj] {
			uuidSources(info, assigns, a.Expr, a.Index, depth+1, out)
		}
	}
}

// isRetryLoop reports whether loop may repeat one operation: a loop over
// a count or a condition, or an endless one. Loops over the items of a
// slice, map, channel or iterator, loops whose condition is a call (rows.Next())
// or a len, and loops that receive or fetch the next unit of work (a
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
		body = l.Body
	case *ast.ForStmt:
		if l.Cond != nil {
			if _, ok := ast.Unparen(l.Cond).(*ast.CallExpr); ok {
				return false
			}
			usesLen := false
			ast.Inspect(l.Cond, func(n ast.Node) bool {
				if call, ok := n.(*ast.CallExpr); ok && (isBuiltin(info, call, "len") || isBuiltin(info, call, "cap")) {
					usesLen = true
				}
				return !usesLen
			})
			if usesLen {
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

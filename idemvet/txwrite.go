package idemvet

import (
	"fmt"
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// TxWrite reports HTTP handlers that take idem's transaction from the
// request context and then end it themselves or write around it.
var TxWrite = &analysis.Analyzer{
	Name: "idemtxwrite",
	Doc:  "report a handler that commits or rolls back idemhttp's transaction, or writes through a pool beside it",
	Run:  runTxWrite,
}

const (
	msgTxEnd    = "handler commits/rolls back idem's transaction: return an error/status instead; the middleware commits"
	msgTxPool   = "write through the pool bypasses the idempotent transaction: use the tx from the request context"
	msgTxPoolIn = "write through the pool bypasses the idempotent transaction (in %s): give it the tx from the request context"
)

// poolMethods are the methods of a pool or connection that run a statement
// or open a transaction of their own.
var poolMethods = []string{"Exec", "ExecContext", "Query", "QueryContext", "QueryRow", "QueryRowContext", "Begin", "BeginTx", "SendBatch", "CopyFrom"}

func runTxWrite(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	assigns := assignments(pass)
	r := newReporter(pass)
	pw := &poolWriters{pass: pass, assigns: assigns, done: make(map[*types.Func]bool)}
	for _, f := range sourceFiles(pass) {
		ast.Inspect(f, func(n ast.Node) bool {
			var (
				sig  *types.Signature
				body *ast.BlockStmt
			)
			switch n := n.(type) {
			case *ast.FuncDecl:
				if obj := info.Defs[n.Name]; obj != nil {
					sig, _ = obj.Type().(*types.Signature)
				}
				body = n.Body
			case *ast.FuncLit:
				sig, _ = info.TypeOf(n).(*types.Signature)
				body = n.Body
			default:
				return true
			}
			if body != nil && sig != nil && isHandler(sig) {
				checkHandler(info, assigns, pw, r, body)
			}
			return true
		})
	}
	return nil, nil
}

// isHandler reports whether sig is func(http.ResponseWriter, *http.Request).
func isHandler(sig *types.Signature) bool {
	p := sig.Params()
	if p.Len() != 2 || sig.Results().Len() != 0 {
		return false
	}
	w, ok := types.Unalias(p.At(0).Type()).(*types.Named)
	if !ok || !isNamed(w, httpPath, "ResponseWriter") {
		return false
	}
	req, ok := types.Unalias(p.At(1).Type()).(*types.Pointer)
	return ok && isType(req, httpPath, "Request")
}

// checkHandler reports in a handler body that takes the transaction with
// idemhttp.TxFromContext.
func checkHandler(info *types.Info, assigns map[types.Object][]assignment, pw *poolWriters, r *reporter, body *ast.BlockStmt) {
	txs := make(map[types.Object]bool)
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		var lhs []ast.Expr
		var rhs []ast.Expr
		switch n := n.(type) {
		case *ast.AssignStmt:
			lhs, rhs = n.Lhs, n.Rhs
		case *ast.ValueSpec:
			for _, id := range n.Names {
				lhs = append(lhs, id)
			}
			rhs = n.Values
		case *ast.CallExpr:
			if isFunc(callee(info, n), idemhttpPath, "TxFromContext") {
				found = true
			}
			return true
		default:
			return true
		}
		if len(rhs) != 1 || len(lhs) == 0 {
			return true
		}
		call, ok := ast.Unparen(rhs[0]).(*ast.CallExpr)
		if !ok || !isFunc(callee(info, call), idemhttpPath, "TxFromContext") {
			return true
		}
		if id, ok := lhs[0].(*ast.Ident); ok {
			if obj := info.ObjectOf(id); obj != nil {
				txs[obj] = true
			}
		}
		return true
	})
	if !found {
		return
	}
	ends := func(sel *ast.SelectorExpr) bool {
		if sel.Sel.Name != "Commit" && sel.Sel.Name != "Rollback" {
			return false
		}
		id, ok := ast.Unparen(sel.X).(*ast.Ident)
		return ok && txs[info.ObjectOf(id)]
	}
	called := make(map[*ast.SelectorExpr]bool)
	ast.Inspect(body, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok && !called[sel] && ends(sel) {
			// tx.Commit as a method value: commit := tx.Commit, or
			// passed to a function that calls it.
			r.report(sel, msgTxEnd)
			return true
		}
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
		if !ok {
			return true
		}
		called[sel] = true
		if sel.Sel.Name == "Commit" || sel.Sel.Name == "Rollback" {
			if ends(sel) {
				r.report(call, msgTxEnd)
			}
			return true
		}
		if poolWrite(info, assigns, call) {
			r.report(call, msgTxPool)
		} else if fn := callee(info, call); pw.writes(fn) {
			// A repository of the package, not given the transaction.
			r.report(call, fmt.Sprintf(msgTxPoolIn, fn.Name()))
		}
		return true
	})
}

// poolWrite reports whether call writes through a pool or connection
// beside a transaction: a statement other than a read (a constant SELECT
// without a locking clause, see isReadOnlySQL, through Query or QueryRow),
// a transaction of its own (Begin, or pgx.BeginFunc on a pool).
func poolWrite(info *types.Info, assigns map[types.Object][]assignment, call *ast.CallExpr) bool {
	fn := callee(info, call)
	if isFunc(fn, pgxPath, "BeginFunc", "BeginTxFunc") && len(call.Args) > 1 && isPoolHandle(info.TypeOf(call.Args[1])) {
		return true // a transaction of its own on the pool
	}
	if fn == nil || dbHandle(fn) != dbPool || !contains(poolMethods, fn.Name()) {
		return false
	}
	if q, ok := sqlArg(info, assigns, call); ok && isReadOnlySQL(q) && fn.Name() != "Exec" && fn.Name() != "ExecContext" {
		return false // a read beside the transaction
	}
	return true
}

// poolWriters tells which functions and methods of the package write
// through a pool (poolWrite), themselves or through others of the package.
type poolWriters struct {
	pass    *analysis.Pass
	assigns map[types.Object][]assignment
	done    map[*types.Func]bool
}

func (p *poolWriters) writes(fn *types.Func) bool {
	if fn == nil || fn.Pkg() != p.pass.Pkg {
		return false
	}
	if v, ok := p.done[fn]; ok {
		return v
	}
	p.done[fn] = false // a recursive call adds nothing
	decl := funcDecl(p.pass, fn)
	if decl == nil {
		return false
	}
	info := p.pass.TypesInfo
	v := false
	ast.Inspect(decl.Body, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok && !v {
			v = poolWrite(info, p.assigns, call) || p.writes(callee(info, call))
		}
		return !v
	})
	p.done[fn] = v
	return v
}

// isPoolHandle reports whether t is a pgx pool or connection (what
// pgx.BeginFunc opens a transaction of its own on), not a transaction.
func isPoolHandle(t types.Type) bool {
	return isType(t, pgxpoolPath, "Pool") || isType(t, pgxpoolPath, "Conn") || isType(t, pgxPath, "Conn")
}

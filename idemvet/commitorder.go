package idemvet

import (
	"go/ast"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// The second half of idemautocommit: offsets committed by hand, but before
// the database write that applies the records.

const (
	msgCommitBeforeWrite = "kafka offsets committed (or marked) before the database write that applies the records: commit them after the transaction commits, or a crash in between loses the records"
	msgCommitHandOff     = "kafka offsets committed (or marked) for records handed to another goroutine that may not have applied them yet: commit after the workers are done (wait for them), or in the worker after its transaction commits"
	msgConfluentAuto     = "confluent-kafka-go consumer group commits polled offsets on a timer (enable.auto.commit with enable.auto.offset.store, librdkafka's defaults), whether or not the database transaction committed: set \"enable.auto.offset.store\": false and StoreMessage after the transaction commits (or \"enable.auto.commit\": false and CommitMessage)"
)

// isOffsetCommit reports whether fn commits or marks consumed offsets:
// franz-go's CommitRecords, CommitUncommittedOffsets, CommitMarkedOffsets,
// CommitOffsets, CommitOffsetsSync, MarkCommitRecords, MarkCommitOffsets; kafka-go's CommitMessages;
// sarama's MarkMessage, MarkOffset and Commit on a session (or an offset
// manager's partition); confluent-kafka-go's Commit, CommitMessage,
// CommitOffsets, StoreMessage and StoreOffsets.
func isOffsetCommit(fn *types.Func) bool {
	if isMethod(fn, kgoPath, "Client", "CommitRecords", "CommitUncommittedOffsets", "CommitMarkedOffsets", "CommitOffsets", "CommitOffsetsSync", "MarkCommitRecords", "MarkCommitOffsets") ||
		isMethod(fn, kafkagoPath, "Reader", "CommitMessages") {
		return true
	}
	for _, p := range saramaPaths {
		if isMethod(fn, p, "ConsumerGroupSession", "MarkMessage", "MarkOffset", "Commit") ||
			isMethod(fn, p, "PartitionOffsetManager", "MarkOffset") {
			return true
		}
	}
	for _, p := range confluentPaths {
		if isMethod(fn, p, "Consumer", "Commit", "CommitMessage", "CommitOffsets", "StoreMessage", "StoreOffsets") {
			return true
		}
	}
	return false
}

// isDBWrite reports whether call applies something to a database: Exec
// (and ExecContext) on a pgx, pgxpool or database/sql handle, a Query or
// QueryRow on one whose constant SQL writes (isWriteQuery), or Commit on a
// transaction of one of them.
func isDBWrite(info *types.Info, assigns map[types.Object][]assignment, call *ast.CallExpr) bool {
	fn := callee(info, call)
	switch dbHandle(fn) {
	case dbPool:
		return contains(execNames, fn.Name()) || isWriteQuery(info, assigns, call)
	case dbTx:
		return contains(execNames, fn.Name()) || fn.Name() == "Commit" || isWriteQuery(info, assigns, call)
	}
	return false
}

// isWriteQuery reports whether call is a Query or QueryRow (and their
// Context forms) on a database handle whose constant SQL (see sqlArg)
// writes: INSERT ... RETURNING, as pgx code often inserts, an UPDATE or
// DELETE with RETURNING, a WITH that modifies; not a read (isReadOnlySQL)
// nor SQL that is not constant.
func isWriteQuery(info *types.Info, assigns map[types.Object][]assignment, call *ast.CallExpr) bool {
	fn := callee(info, call)
	if dbHandle(fn) == notDB || !contains(queryNames, fn.Name()) {
		return false
	}
	q, ok := sqlArg(info, assigns, call)
	if !ok || isReadOnlySQL(q) {
		return false
	}
	words := sqlWords(q)
	return len(words) > 0 && contains([]string{"INSERT", "UPDATE", "DELETE", "MERGE", "WITH"}, words[0])
}

// checkCommitOrder reports, in every block of the package's functions (the
// statements of a case of a switch or select too), an offset commit
// followed, later in the same block, by a database write (there, in a
// function of the package called there, or in a callback a call there
// runs: see dbWrites): the offsets of a loop iteration committed before
// its records were applied.
// A deferred commit, or one run in a goroutine, is not considered.
func checkCommitOrder(pass *analysis.Pass, assigns map[types.Object][]assignment, r *reporter) {
	info := pass.TypesInfo
	w := &dbWrites{pass: pass, assigns: assigns, done: make(map[*types.Func]bool)}
	for _, f := range sourceFiles(pass) {
		ast.Inspect(f, func(n ast.Node) bool {
			var list []ast.Stmt
			switch n := n.(type) {
			case *ast.BlockStmt:
				list = n.List
			case *ast.CaseClause: // a case of a switch: a block of its own
				list = n.Body
			case *ast.CommClause: // case msg := <-claim.Messages():
				list = n.Body
			default:
				return true
			}
			var commits []*ast.CallExpr
			handedOff := false // records handed to other goroutines, not waited for
			for _, st := range list {
				if handedOff {
					for _, c := range flowingCommits(info, st) {
						r.report(c, msgCommitHandOff)
					}
				}
				switch {
				case handsOffRecords(info, st):
					// Also when it waits too: select { case jobs <- m:
					// case <-ctx.Done(): }
					handedOff = true
				case waitsForWorkers(info, st):
					handedOff = false
				}
				switch st.(type) {
				case *ast.DeferStmt, *ast.GoStmt:
					continue
				}
				if w.in(st) {
					for _, c := range commits {
						r.report(c, msgCommitBeforeWrite)
					}
					commits = nil
				}
				commits = append(commits, flowingCommits(info, st)...)
			}
			return true
		})
	}
}

// dbWrites tells whether statements write to a database: an Exec or a
// transaction's Commit (isDBWrite), in the statement itself, in a function
// literal a call of it is given (a transaction helper's callback,
// pgx.BeginFunc's: run by the call, not later; time.AfterFunc's excepted),
// or in a function or method of the package it calls (a handler, a
// repository), and in what those call.
type dbWrites struct {
	pass    *analysis.Pass
	assigns map[types.Object][]assignment
	done    map[*types.Func]bool // functions of the package: whether they write
}

func (w *dbWrites) in(n ast.Node) bool {
	info := w.pass.TypesInfo
	wrote := false
	ast.Inspect(n, func(n ast.Node) bool {
		if wrote {
			return false
		}
		switch n := n.(type) {
		case *ast.FuncLit:
			return false // runs later, or elsewhere (a callback: below)
		case *ast.CallExpr:
			fn := callee(info, n)
			if isOffsetCommit(fn) {
				return true
			}
			if isDBWrite(info, w.assigns, n) || w.function(fn) {
				wrote = true
				return false
			}
			if isFunc(fn, timePath, "AfterFunc") {
				return true
			}
			for _, a := range n.Args {
				if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok && w.in(lit.Body) {
					wrote = true
					return false
				}
			}
		}
		return true
	})
	return wrote
}

// function tells whether fn, a function or method of the package, writes
// to a database, itself or in what it calls.
func (w *dbWrites) function(fn *types.Func) bool {
	if fn == nil || fn.Pkg() != w.pass.Pkg {
		return false
	}
	if v, ok := w.done[fn]; ok {
		return v
	}
	w.done[fn] = false // a recursive call adds nothing
	decl := funcDecl(w.pass, fn)
	if decl == nil {
		return false
	}
	v := w.in(decl.Body)
	w.done[fn] = v
	return v
}

// handsOffRecords reports whether st hands Kafka records to other
// goroutines: a channel send of a record (a worker pool's queue), or a go
// statement given one (go h.apply(ctx, r)) or whose function literal uses
// one; also in the loops and branches of st, and in a function literal a
// call of st runs (EachPartition's callback).
func handsOffRecords(info *types.Info, st ast.Stmt) bool {
	found := false
	ast.Inspect(st, func(n ast.Node) bool {
		if found {
			return false
		}
		switch n := n.(type) {
		case *ast.FuncLit:
			return false // runs later, or elsewhere (a callback: below)
		case *ast.CallExpr:
			// A callback the call runs: fs.EachPartition(func(p) { go ... }).
			for _, a := range n.Args {
				if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok && handsOffRecords(info, lit.Body) {
					found = true
				}
			}
		case *ast.SendStmt:
			found = holdsRecord(info, n.Value)
		case *ast.GoStmt:
			if lit, ok := ast.Unparen(n.Call.Fun).(*ast.FuncLit); ok {
				found = holdsRecord(info, lit.Body)
			}
			for _, a := range n.Call.Args {
				found = found || holdsRecord(info, a)
			}
			return false
		}
		return !found
	})
	return found
}

// holdsRecord reports whether n uses a Kafka record (a value of a record
// type: a record, a fetch, a message, a slice of them), not only its
// length.
func holdsRecord(info *types.Info, n ast.Node) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		if found {
			return false
		}
		if call, ok := n.(*ast.CallExpr); ok && (isBuiltin(info, call, "len") || isBuiltin(info, call, "cap")) {
			return false
		}
		if e, ok := n.(ast.Expr); ok && isKafkaRecord(info.TypeOf(e)) {
			found = true
		}
		return !found
	})
	return found
}

// waitsForWorkers reports whether st waits for other goroutines: a call
// of a method named Wait (sync.WaitGroup's, errgroup.Group's, a worker
// pool's), a receive from a channel (their answers), or a select.
func waitsForWorkers(info *types.Info, st ast.Stmt) bool {
	found := false
	ast.Inspect(st, func(n ast.Node) bool {
		if found {
			return false
		}
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.GoStmt:
			return false // the goroutine waits, not st
		case *ast.UnaryExpr:
			found = n.Op == token.ARROW
		case *ast.SelectStmt:
			found = true
		case *ast.RangeStmt:
			if t := info.TypeOf(n.X); t != nil {
				_, found = t.Underlying().(*types.Chan)
			}
		case *ast.CallExpr:
			if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok && sel.Sel.Name == "Wait" {
				found = true
			}
		}
		return !found
	})
	return found
}

// flowingCommits returns the offset commits of st after which control may
// go on to the statement that follows st: not those in a branch of an if,
// or a case of a switch or select, that ends in a return, a continue or a
// panic (or, in an if, a break): a record skipped, marked as done, while
// the loop goes on to the next one.
func flowingCommits(info *types.Info, st ast.Stmt) []*ast.CallExpr {
	var out []*ast.CallExpr
	all := func(n ast.Node) {
		if n == nil { // no Init, Cond or Tag
			return
		}
		ast.Inspect(n, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return false // runs later, or elsewhere
			case *ast.CallExpr:
				if isOffsetCommit(callee(info, n)) {
					out = append(out, n)
				}
			}
			return true
		})
	}
	branch := func(list []ast.Stmt, breakLeaves bool) {
		if leavesBranch(info, list, breakLeaves) {
			return
		}
		for _, s := range list {
			out = append(out, flowingCommits(info, s)...)
		}
	}
	switch st := st.(type) {
	case *ast.IfStmt:
		all(st.Init)
		all(st.Cond)
		branch(st.Body.List, true)
		switch e := st.Else.(type) {
		case *ast.BlockStmt:
			branch(e.List, true)
		case *ast.IfStmt:
			out = append(out, flowingCommits(info, e)...)
		}
	case *ast.BlockStmt:
		branch(st.List, true)
	case *ast.SwitchStmt:
		all(st.Init)
		all(st.Tag)
		for _, c := range st.Body.List {
			cc := c.(*ast.CaseClause)
			for _, e := range cc.List {
				all(e)
			}
			branch(cc.Body, false) // a break leaves the switch only
		}
	case *ast.TypeSwitchStmt:
		all(st.Init)
		all(st.Assign)
		for _, c := range st.Body.List {
			branch(c.(*ast.CaseClause).Body, false)
		}
	case *ast.SelectStmt:
		for _, c := range st.Body.List {
			cc := c.(*ast.CommClause)
			all(cc.Comm)
			branch(cc.Body, false)
		}
	default:
		all(st)
	}
	return out
}

// leavesBranch reports whether the statements of a branch end by leaving
// the enclosing block: a return, a continue, a panic, or (when breakLeaves:
// the branch of an if, whose break leaves the loop or switch around the
// block) a break.
func leavesBranch(info *types.Info, list []ast.Stmt, breakLeaves bool) bool {
	if len(list) == 0 {
		return false
	}
	switch last := list[len(list)-1].(type) {
	case *ast.ReturnStmt:
		return true
	case *ast.BranchStmt:
		return last.Tok == token.CONTINUE || last.Tok == token.BREAK && breakLeaves
	case *ast.ExprStmt:
		call, ok := ast.Unparen(last.X).(*ast.CallExpr)
		return ok && isBuiltin(info, call, "panic")
	}
	return false
}

// checkConfluentAutoCommit reports kafka.NewConsumer given a ConfigMap of
// the package (a literal, or a variable assigned one) with a group.id and
// neither enable.auto.commit nor enable.auto.offset.store set to false
// anywhere in the package.
func checkConfluentAutoCommit(pass *analysis.Pass, assigns map[types.Object][]assignment, r *reporter, files []*ast.File) {
	info := pass.TypesInfo
	group, manual := false, false
	setting := func(key string, v ast.Expr) {
		switch key {
		case "group.id":
			group = true
		case "enable.auto.commit", "enable.auto.offset.store":
			if b, ok := configBool(info, v); !ok || !b {
				manual = true
			}
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if isConfluentMap(info.TypeOf(n)) {
					for _, el := range n.Elts {
						if kv, ok := el.(*ast.KeyValueExpr); ok {
							key, _ := constString(info, kv.Key)
							setting(key, ast.Unparen(kv.Value))
						}
					}
				}
			case *ast.AssignStmt:
				for i, l := range n.Lhs {
					if len(n.Lhs) == len(n.Rhs) && isConfluentMapIndex(info, l) {
						key, _ := constString(info, l.(*ast.IndexExpr).Index)
						setting(key, ast.Unparen(n.Rhs[i]))
					}
				}
			case *ast.CallExpr:
				fn := callee(info, n)
				if recv := recvType(fn); recv != nil && fn.Name() == "SetKey" && len(n.Args) == 2 && isConfluentMap(recv) {
					key, _ := constString(info, n.Args[0])
					setting(key, ast.Unparen(n.Args[1]))
				}
			}
			return true
		})
	}
	if !group || manual {
		return
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok && isFuncIn(callee(info, call), confluentPaths, "NewConsumer") &&
				len(call.Args) == 1 && confluentMapFromPackage(pass, assigns, call.Args[0]) {
				r.report(call, msgConfluentAuto)
			}
			return true
		})
	}
}

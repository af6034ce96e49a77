package idemvet

import (
	"go/ast"
	"go/token"
	"slices"
	"strings"
)

// ignorePrefix starts a suppression comment:
//
//	//idemvet:ignore idemtxwrite,idemcheckinsert the reason, mandatory
//
// Like a //go: directive it has no space after the slashes.
const ignorePrefix = "//idemvet:ignore"

// ignoreDirective is one //idemvet:ignore comment that names at least one
// rule and gives a reason.
type ignoreDirective struct {
	rules   []string
	comment *ast.Comment
	file    *ast.File
}

// lineKey is a line of a file as reported (after //line directives).
type lineKey struct {
	file string
	line int
}

// parseIgnore returns the rules an //idemvet:ignore comment names, or nil
// when text is not one or has no reason: "//idemvet:ignore", white space,
// a comma-separated list of rule names without spaces, white space and a
// reason of at least one non-space character.
func parseIgnore(text string) []string {
	rest, ok := strings.CutPrefix(text, ignorePrefix)
	if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '\t') {
		return nil
	}
	fields := strings.Fields(rest)
	if len(fields) < 2 { // no rule, or no reason
		return nil
	}
	var rules []string
	for r := range strings.SplitSeq(fields[0], ",") {
		if r != "" {
			rules = append(rules, r)
		}
	}
	return rules
}

// ignores indexes the package's //idemvet:ignore comments by the line they
// are on. It is built on the first report: a package without findings
// never reads its comments.
func (r *reporter) ignores() map[lineKey][]ignoreDirective {
	if r.ignoreIndex != nil {
		return r.ignoreIndex
	}
	r.ignoreIndex = make(map[lineKey][]ignoreDirective)
	for _, f := range r.pass.Files {
		for _, g := range f.Comments {
			for _, c := range g.List {
				rules := parseIgnore(c.Text)
				if rules == nil {
					continue
				}
				p := r.pass.Fset.Position(c.Slash)
				k := lineKey{p.Filename, p.Line}
				r.ignoreIndex[k] = append(r.ignoreIndex[k], ignoreDirective{rules, c, f})
			}
		}
	}
	return r.ignoreIndex
}

// ignored reports whether an //idemvet:ignore comment naming the running
// rule silences a finding at pos: a comment on pos's line, or one alone on
// the line above (a comment that ends a line of code above applies to
// that code only).
func (r *reporter) ignored(pos token.Pos) bool {
	idx := r.ignores()
	if len(idx) == 0 {
		return false
	}
	name := r.pass.Analyzer.Name
	p := r.pass.Fset.Position(pos)
	for _, d := range idx[lineKey{p.Filename, p.Line}] {
		if slices.Contains(d.rules, name) {
			return true
		}
	}
	for _, d := range idx[lineKey{p.Filename, p.Line - 1}] {
		if slices.Contains(d.rules, name) && !r.codeBefore(d.file, d.comment.Slash) {
			return true
		}
	}
	return false
}

// codeBefore reports whether code precedes the comment at pos on its line
// of f: a node of f starts or ends on that line before pos.
func (r *reporter) codeBefore(f *ast.File, pos token.Pos) bool {
	tf := r.pass.Fset.File(pos)
	if tf == nil {
		return false
	}
	line := tf.Line(pos)
	lineStart := tf.LineStart(line)
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		if found || n == nil {
			return false
		}
		if _, ok := n.(*ast.CommentGroup); ok {
			return false
		}
		if n.End() <= lineStart || n.Pos() >= pos {
			return false // wholly before the line, or after the comment
		}
		// n overlaps [lineStart, pos): code on the line before the
		// comment if it starts or ends there, else look inside.
		if n.Pos() >= lineStart || n.End() <= pos {
			found = true
			return false
		}
		return true
	})
	return found
}

package app

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// exported is what idemd's registry serves of one metric: its type, its
// labels and the values seen of each.
type exported struct {
	typ    string
	labels map[string]map[string]bool
}

// openLabels are the labels whose values are not known in advance (the
// others are exported at 0 from the start, every value of them).
var openLabels = map[string]bool{"route": true, "status": true}

func exportedMetrics(t *testing.T) map[string]exported {
	t.Helper()
	families, err := exercisedMetrics().reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]exported{}
	for _, f := range families {
		e := exported{typ: strings.ToLower(f.GetType().String()), labels: map[string]map[string]bool{}}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if e.labels[l.GetName()] == nil {
					e.labels[l.GetName()] = map[string]bool{}
				}
				e.labels[l.GetName()][l.GetValue()] = true
			}
		}
		out[f.GetName()] = e
	}
	return out
}

// TestAlertRules keeps docs/alerts.yml, the runbook's alerts as a
// Prometheus rule file, true to docs/operations.md's "Alerts" table (each
// row's expression and for are a rule's) and to what idemd exports: every
// metric an expression reads is one idemd has, every label matcher and
// by() a label of it, every value matched of a label idemd exports at 0
// from the start one it exports (a typo there is an alert that never
// fires), every regular expression one Prometheus compiles (RE2, as Go's)
// and every range and for a Prometheus duration. promtool is not at hand:
// this is no full PromQL parse, but brackets and quotes must balance.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	metrics := exportedMetrics(t)
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	rulesFile, err := os.ReadFile("../../docs/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}

	type alert struct{ name, expr, for_ string }
	// The table: | alert | expression | for | why |, pipes inside cells
	// escaped as \|; the expression is the column's last code span.
	var rows []alert
	section := false
	for line := range strings.SplitSeq(string(doc), "\n") {
		if strings.HasPrefix(line, "## ") {
			section = line == "## Alerts"
		}
		if !section || !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| alert ") {
			continue
		}
		cols := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), "|")
		if len(cols) < 5 {
			t.Errorf("docs/operations.md: alerts row %q has fewer than 4 columns", line)
			continue
		}
		spans := regexp.MustCompile("`([^`]*)`").FindAllStringSubmatch(cols[2], -1)
		if len(spans) == 0 {
			t.Errorf("docs/operations.md: alerts row %q has no expression", line)
			continue
		}
		rows = append(rows, alert{
			name: strings.TrimSpace(cols[1]),
			expr: strings.ReplaceAll(spans[len(spans)-1][1], "\x00", "|"),
			for_: strings.TrimSpace(cols[3]),
		})
	}
	if len(rows) < 10 {
		t.Fatalf("read %d alerts from docs/operations.md's table; the parser no longer matches it", len(rows))
	}

	// The rule file, in the one shape it has (no YAML parser among the
	// module's dependencies): groups, rules of alert, expr, for, labels
	// and annotations, values in single quotes where they hold more than
	// a word.
	var rules []alert
	var runbooks []string
	unquote := func(v string) string {
		if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			return strings.ReplaceAll(v[1:len(v)-1], "''", "'")
		}
		return v
	}
	for i, line := range strings.Split(string(rulesFile), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		key, value, ok := strings.Cut(strings.TrimPrefix(trimmed, "- "), ":")
		if !ok {
			t.Errorf("docs/alerts.yml:%d: %q is no key: value", i+1, line)
			continue
		}
		value = unquote(strings.TrimSpace(value))
		switch {
		case indent == 0 && key == "groups", indent == 2 && key == "name" && strings.HasPrefix(trimmed, "- "),
			indent == 4 && key == "rules":
		case indent == 6 && key == "alert" && strings.HasPrefix(trimmed, "- "):
			rules = append(rules, alert{name: value})
		case indent == 8 && len(rules) > 0 && key == "expr":
			rules[len(rules)-1].expr = value
		case indent == 8 && len(rules) > 0 && key == "for":
			rules[len(rules)-1].for_ = value
		case indent == 8 && (key == "labels" || key == "annotations") && value == "":
		case indent == 10 && key == "severity":
			if value != "page" && value != "ticket" {
				t.Errorf("docs/alerts.yml:%d: severity %q; want page or ticket", i+1, value)
			}
		case indent == 10 && key == "summary":
		case indent == 10 && key == "runbook":
			runbooks = append(runbooks, value)
		default:
			t.Errorf("docs/alerts.yml:%d: unexpected %q", i+1, line)
		}
	}
	names := map[string]bool{}
	for _, r := range rules {
		if names[r.name] || !regexp.MustCompile(`^Idemd[A-Za-z0-9]+$`).MatchString(r.name) || r.expr == "" {
			t.Errorf("docs/alerts.yml: rule %q: a name used twice, not Idemd..., or no expr", r.name)
		}
		names[r.name] = true
	}
	for _, row := range rows {
		i := slices.IndexFunc(rules, func(r alert) bool { return r.expr == row.expr })
		switch {
		case i < 0:
			t.Errorf("docs/alerts.yml has no rule of the runbook's alert %q: %s", row.name, row.expr)
		case rules[i].for_ != row.for_:
			t.Errorf("docs/alerts.yml: %s has for %q, the runbook's %q for %q", rules[i].name, rules[i].for_, row.for_, row.name)
		}
	}
	// The runbook links point at headings of docs/operations.md.
	slugs := map[string]bool{}
	for line := range strings.SplitSeq(string(doc), "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			slug := strings.ToLower(regexp.MustCompile(`[^\w\- ]`).ReplaceAllString(h, ""))
			slugs[strings.ReplaceAll(slug, " ", "-")] = true
		}
	}
	for _, rb := range runbooks {
		if anchor, ok := strings.CutPrefix(rb, "docs/operations.md#"); !ok || !slugs[anchor] {
			t.Errorf("docs/alerts.yml: runbook %q is no heading of docs/operations.md", rb)
		}
	}

	for _, r := range append(rows, rules...) {
		for _, err := range checkExpr(r.expr, metrics) {
			t.Errorf("%q: %s: %s", r.name, r.expr, err)
		}
		if r.for_ != "" && !promDuration.MatchString(r.for_) {
			t.Errorf("%q: for %q is no Prometheus duration", r.name, r.for_)
		}
	}
}

var (
	promDuration = regexp.MustCompile(`^([0-9]+(ms|[smhdwy]))+$`)
	selector     = regexp.MustCompile(`\b((?:idemd|process|go)_[a-z0-9_]+)(\{[^}]*\})?(\[[^\]]*\])?`)
	matcher      = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$`)
	grouping     = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// checkExpr returns what is wrong with the PromQL expression expr against
// the metrics idemd exports.
func checkExpr(expr string, metrics map[string]exported) []string {
	var errs []string
	// Brackets and quotes.
	var stack []rune
	quoted := false
	for _, c := range expr {
		switch {
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '(' || c == '{' || c == '[':
			stack = append(stack, c)
		case c == ')' || c == '}' || c == ']':
			open := map[rune]rune{')': '(', '}': '{', ']': '['}[c]
			if len(stack) == 0 || stack[len(stack)-1] != open {
				return append(errs, "unbalanced "+string(c))
			}
			stack = stack[:len(stack)-1]
		}
	}
	if quoted || len(stack) > 0 {
		return append(errs, "an unclosed quote or bracket")
	}

	// The labels each by() may name: those of the metrics read.
	available := map[string]bool{}
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		name, base := m[1], m[1]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && metrics[b].typ == "histogram" {
				base = b
			}
		}
		e, ok := metrics[base]
		if !ok {
			errs = append(errs, "reads "+name+", which idemd does not export")
			continue
		}
		labels := map[string]map[string]bool{}
		for l, v := range e.labels {
			labels[l] = v
		}
		if name != base && strings.HasSuffix(name, "_bucket") {
			labels["le"] = nil
		}
		for l := range labels {
			available[l] = true
		}
		if m[2] != "" {
			for _, part := range splitMatchers(m[2][1 : len(m[2])-1]) {
				mm := matcher.FindStringSubmatch(part)
				if mm == nil {
					errs = append(errs, "matcher "+strconv.Quote(part)+" of "+name+" is no label=\"value\"")
					continue
				}
				label, op, value := mm[1], mm[2], mm[3]
				values, ok := labels[label]
				if !ok {
					errs = append(errs, name+" has no label "+label)
					continue
				}
				known := !openLabels[label] && label != "le"
				switch op {
				case "=", "!=":
					if known && !values[value] {
						errs = append(errs, name+" exports no "+label+"="+strconv.Quote(value))
					}
				case "=~", "!~":
					re, err := regexp.Compile("^(?:" + value + ")$")
					if err != nil {
						errs = append(errs, name+": "+label+" regexp: "+err.Error())
						continue
					}
					if !known {
						continue
					}
					for _, alt := range strings.Split(value, "|") {
						if regexp.QuoteMeta(alt) == alt && !values[alt] {
							errs = append(errs, name+" exports no "+label+"="+strconv.Quote(alt))
						}
					}
					if !slices.ContainsFunc(slices.Collect(mapKeys(values)), re.MatchString) {
						errs = append(errs, name+": "+label+"=~"+strconv.Quote(value)+" matches none of its values")
					}
				}
			}
		}
		if m[3] != "" && !promDuration.MatchString(m[3][1:len(m[3])-1]) {
			errs = append(errs, "range "+m[3]+" is no Prometheus duration")
		}
	}
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			if l = strings.TrimSpace(l); !available[l] {
				errs = append(errs, "groups by "+l+", which no metric it reads has")
			}
		}
	}
	return errs
}

// splitMatchers splits a selector's matchers at the commas outside quotes.
func splitMatchers(s string) []string {
	var out []string
	quoted, start := false, 0
	for i, c := range s {
		switch {
		case c == '"' && (i == 0 || s[i-1] != '\\'):
			quoted = !quoted
		case c == ',' && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

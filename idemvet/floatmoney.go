package idemvet

import (
	"go/ast"
	"go/types"
	"reflect"
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/tools/go/analysis"
)

// FloatMoney reports amounts of money held in floating point where they
// leave the program: JSON or database struct fields and SQL arguments.
var FloatMoney = &analysis.Analyzer{
	Name: "idemfloatmoney",
	Doc:  "report float32/float64 money (amount, price, total, ...) in tagged struct fields and SQL arguments",
	Run:  runFloatMoney,
}

const msgFloatMoney = "money held as float: use integer minor units or a decimal type"

// moneyWords are the words of a name that make it money.
var moneyWords = []string{
	"amount", "amounts", "amt", "price", "prices", "total", "totals", "subtotal",
	"balance", "balances", "cost", "costs", "fee", "fees", "money", "sum", "sums",
}

// unitWords are the words of a name that make it some other quantity
// (TotalSeconds, PriceRatio, SumSq).
var unitWords = []string{
	"seconds", "secs", "sec", "ms", "millis", "micros", "nanos", "minutes", "mins", "hours", "days",
	"duration", "time", "ratio", "rate", "percent", "pct", "percentage", "count", "weight", "score",
	"bytes", "size", "latency", "distance", "temperature", "sq", "squares",
}

// aggregateWords are the money words that also name an aggregate of any
// measurement: the sum of a histogram, a total count of seconds.
var aggregateWords = []string{"sum", "sums", "total", "totals"}

// statWords are the words of a name that make it a statistic of
// measurements (min, max, mean, buckets, a quantile); beside one, a sum or
// total is an aggregate of the same measurements.
var statWords = []string{
	"min", "max", "mean", "avg", "average", "median", "stddev", "stdev", "variance",
	"quantile", "quantiles", "percentile", "percentiles", "bucket", "buckets", "bounds",
}

// explainCostKeys are the keys of PostgreSQL's EXPLAIN (FORMAT JSON) that
// hold the planner's cost estimate of a plan node: a field tagged with one
// is not money, whatever its Go name (TotalCost).
var explainCostKeys = []string{"Startup Cost", "Total Cost"}

func runFloatMoney(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	r := newReporter(pass)
	for _, f := range sourceFiles(pass) {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.StructType:
				stats := hasStatisticField(n)
				for _, field := range n.Fields.List {
					if field.Tag == nil || !isFloat(info.TypeOf(field.Type)) {
						continue
					}
					tagName, tagged := serialTag(field.Tag.Value)
					if !tagged || contains(explainCostKeys, tagName) {
						continue
					}
					for _, name := range field.Names {
						if !isMoneyName(name.Name) && !isMoneyName(tagName) {
							continue
						}
						if stats && !namesMoney(name.Name) && !namesMoney(tagName) {
							continue // the sum of a histogram, beside its min and max
						}
						r.report(name, msgFloatMoney)
					}
				}
			case *ast.CallExpr:
				fn := callee(info, n)
				if dbHandle(fn) == notDB || !contains(sqlNames, fn.Name()) {
					return true
				}
				for _, a := range n.Args {
					if name, ok := argName(a); ok && isFloat(info.TypeOf(a)) && isMoneyName(name) {
						r.report(a, msgFloatMoney)
					}
				}
			}
			return true
		})
	}
	return nil, nil
}

// serialTag returns the name a json or db struct tag gives the field, and
// whether it has one that does not exclude it ("-").
func serialTag(lit string) (string, bool) {
	tag, err := strconv.Unquote(lit)
	if err != nil {
		return "", false
	}
	for _, key := range []string{"json", "db"} {
		v, ok := reflect.StructTag(tag).Lookup(key)
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(v, ",")
		if name == "-" {
			continue
		}
		return name, true
	}
	return "", false
}

// argName returns the name of a variable or field argument.
func argName(e ast.Expr) (string, bool) {
	switch e := ast.Unparen(e).(type) {
	case *ast.Ident:
		return e.Name, true
	case *ast.SelectorExpr:
		return e.Sel.Name, true
	case *ast.StarExpr:
		return argName(e.X)
	}
	return "", false
}

// isFloat reports whether t is a floating-point type, or a pointer to one.
func isFloat(t types.Type) bool {
	if t == nil {
		return false
	}
	if p, ok := t.Underlying().(*types.Pointer); ok {
		t = p.Elem()
	}
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Info()&types.IsFloat != 0
}

// isMoneyName reports whether one of the words of name (split at case
// changes, digits and punctuation) is a money word and none is a unit.
func isMoneyName(name string) bool {
	money := false
	for _, w := range words(name) {
		if contains(unitWords, w) {
			return false
		}
		if contains(moneyWords, w) {
			money = true
		}
	}
	return money
}

// words splits an identifier or tag name into lower-case words:
// "TotalAmountEUR" is total, amount, eur; "unit_price2" is unit, price.
func words(name string) []string {
	var out []string
	rs := []rune(name)
	start := -1
	flush := func(end int) {
		if start >= 0 && end > start {
			out = append(out, strings.ToLower(string(rs[start:end])))
		}
		start = -1
	}
	for i, c := range rs {
		if !unicode.IsLetter(c) {
			flush(i)
			continue
		}
		if start < 0 {
			start = i
			continue
		}
		prev := rs[i-1]
		nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
		// aB splits before B; ABc splits before B.
		if unicode.IsUpper(c) && (unicode.IsLower(prev) || (unicode.IsUpper(prev) && nextLower)) {
			flush(i)
			start = i
		}
	}
	flush(len(rs))
	return out
}

// statCompanions are the words that may stand beside a statistic word in
// the name of a statistic (BucketCounts, ExplicitBounds, MaxValue), with
// the unit words (MaxMs, MinLatency).
var statCompanions = []string{"count", "counts", "value", "values", "explicit"}

// hasStatisticField reports whether the struct has a field (of any type)
// whose Go or tag name is a statistic of measurements: a quantile (P99),
// or only statistic, unit and companion words with at least one statistic
// word (Min, Max, Mean, BucketCounts, MaxMs); not a limit (MaxItems) nor
// money (MinPrice).
func hasStatisticField(st *ast.StructType) bool {
	isStat := func(name string) bool {
		if name == "" || isMoneyName(name) {
			return false
		}
		if len(name) >= 3 && (name[0] == 'p' || name[0] == 'P') && strings.Trim(name[1:], "0123456789") == "" {
			return true // p99, P50
		}
		stat := false
		for _, w := range words(name) {
			switch {
			case contains(statWords, w):
				stat = true
			case contains(unitWords, w), contains(statCompanions, w):
			default:
				return false // MaxItems: a limit
			}
		}
		return stat
	}
	for _, field := range st.Fields.List {
		tagName := ""
		if field.Tag != nil {
			tagName, _ = serialTag(field.Tag.Value)
		}
		if isStat(tagName) {
			return true
		}
		for _, name := range field.Names {
			if isStat(name.Name) {
				return true
			}
		}
	}
	return false
}

// namesMoney reports whether name is money by a word other than sum or
// total (amount, price, fee, ...): money whatever stands beside it.
func namesMoney(name string) bool {
	if !isMoneyName(name) {
		return false
	}
	for _, w := range words(name) {
		if contains(moneyWords, w) && !contains(aggregateWords, w) {
			return true
		}
	}
	return false
}

package app

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
)

// envPrefix starts the names of idemd's environment variables.
const envPrefix = "IDEMD_"

// knownEnv returns the IDEMD_ variables idemd reads, those idemd -h lists:
// the settings', EnvKafkaSASLPassword and EnvOTel.
func knownEnv() []string {
	names := []string{EnvKafkaSASLPassword, EnvOTel}
	for _, s := range settings {
		names = append(names, s.env)
	}
	return names
}

// envHints are the names, other than idemd's, that an operator reaches
// for by habit, and the variable idemd reads instead.
var envHints = []struct{ habit, env string }{
	{"IDEMD_DATABASE_URL", "IDEMD_DB"},
	{"IDEMD_DATABASE", "IDEMD_DB"},
	{"IDEMD_DB_URL", "IDEMD_DB"},
	{"IDEMD_DSN", "IDEMD_DB"},
	{"IDEMD_POSTGRES_URL", "IDEMD_DB"},
	{"IDEMD_LISTEN_ADDR", "IDEMD_ADDR"},
	{"IDEMD_ADDRESS", "IDEMD_ADDR"},
	{"IDEMD_PORT", "IDEMD_ADDR"},
	{"IDEMD_METRICS_ADDR", "IDEMD_ADMIN_ADDR"},
	{"IDEMD_METRICS_PORT", "IDEMD_ADMIN_ADDR"},
	{"IDEMD_ADMIN_PORT", "IDEMD_ADMIN_ADDR"},
	{"IDEMD_KAFKA_BROKERS", "IDEMD_KAFKA"},
	{"IDEMD_BROKERS", "IDEMD_KAFKA"},
	{"IDEMD_TOPIC", "IDEMD_KAFKA_TOPIC"},
}

// checkEnv returns a *ConfigError naming the variables of environ
// ("NAME=value", as os.Environ returns them) that start with IDEMD_, in
// any case, and that idemd does not read: a typo would otherwise leave
// the setting at its default (IDEMD_DATABSE_URL: SQLite instead of
// PostgreSQL) without a word. Values are never shown.
func checkEnv(environ []string) error {
	known := knownEnv()
	isKnown := func(name string) bool {
		if runtime.GOOS == "windows" { // names are case-insensitive there
			return slices.ContainsFunc(known, func(k string) bool { return strings.EqualFold(k, name) })
		}
		return slices.Contains(known, name)
	}
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(strings.ToUpper(name), envPrefix) && !isKnown(name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	unknown = slices.Compact(unknown)
	var b strings.Builder
	b.WriteString("unknown environment variable")
	if len(unknown) > 1 {
		b.WriteString("s")
	}
	unmatched := false
	for i, name := range unknown {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(" " + name)
		if s := suggestEnv(name, known); s != "" {
			fmt.Fprintf(&b, " (did you mean %s?)", s)
		} else {
			unmatched = true
		}
	}
	if unmatched {
		b.WriteString(" (idemd -h lists the variables idemd reads)")
	}
	return &ConfigError{msg: b.String()}
}

// suggestEnv returns the known variable name was probably meant to be, or
// "": the same name in upper case, a name within a few typos of it
// (the closest), or the variable a habitual name (within one typo)
// stands for.
func suggestEnv(name string, known []string) string {
	upper := strings.ToUpper(name)
	best, bestDist := "", 0
	for _, k := range known {
		// A typo or two, and up to one in four letters of longer names.
		limit := max(2, len(k)/4)
		if d := editDistance(upper, k); d <= limit && (best == "" || d < bestDist) {
			best, bestDist = k, d
		}
	}
	if best != "" {
		return best
	}
	for _, h := range envHints {
		if editDistance(upper, h.habit) <= 1 {
			return h.env
		}
	}
	return ""
}

// editDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and transpositions of adjacent
// bytes that turn a into b.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

package app_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/app"
)

// TestReadmeFlagTable checks the README's table of idemd's flags against
// idemd -h (app.Usage): every flag is listed with its environment variable,
// a non-empty default is spelled as -h prints it, and the table names no
// flag idemd does not have.
func TestReadmeFlagTable(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ flags, envs, def string }
	rows := map[string]row{} // by flag
	cell := regexp.MustCompile("`([^`]*)`")
	for _, line := range strings.Split(string(readme), "\n") {
		if !strings.HasPrefix(line, "| `-") && !strings.HasPrefix(line, "| | `IDEMD_") {
			continue
		}
		cols := strings.Split(line, "|") // "", flags, environment, default, what, ""
		if len(cols) < 5 {
			continue
		}
		r := row{flags: cols[1], envs: cols[2], def: strings.TrimSpace(cols[3])}
		for _, m := range cell.FindAllStringSubmatch(r.flags, -1) {
			rows[m[1]] = r
		}
	}
	usage := regexp.MustCompile(`(?m)^  (-[a-z-]+) \((IDEMD_[A-Z_]+), default ("[^"]*"|false)`)
	seen := map[string]bool{}
	for _, m := range usage.FindAllStringSubmatch(app.Usage(), -1) {
		flag, env, def := m[1], m[2], strings.Trim(m[3], `"`)
		seen[flag] = true
		r, ok := rows[flag]
		if !ok {
			t.Errorf("README's flag table has no row for %s", flag)
			continue
		}
		if !strings.Contains(r.envs, "`"+env+"`") {
			t.Errorf("README: %s's environment variable is %q, idemd -h says %s", flag, r.envs, env)
		}
		if def != "" && !strings.HasPrefix(r.def, "`"+def+"`") {
			t.Errorf("README: %s's default is %q, idemd -h says %q", flag, r.def, def)
		}
	}
	if len(seen) < 20 {
		t.Fatalf("read %d flags from app.Usage(); the pattern no longer matches it", len(seen))
	}
	for flag := range rows {
		if !seen[flag] {
			t.Errorf("README's flag table lists %s, which idemd -h does not", flag)
		}
	}
}

package idemvet_test

import (
	"testing"
	"time"

	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/idemkit/idem/idemvet"
)

// TestRepository runs every analyzer over the module's own packages (test
// files excluded): idem passes its own rules.
func TestRepository(t *testing.T) {
	if testing.Short() {
		t.Skip("loads and type-checks the whole module")
	}
	start := time.Now()
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedCompiledGoFiles | packages.NeedImports |
			packages.NeedTypes | packages.NeedTypesSizes | packages.NeedSyntax | packages.NeedTypesInfo |
			packages.NeedModule,
		Dir: "..",
	}
	pkgs, err := packages.Load(cfg, "github.com/idemkit/idem/...")
	if err != nil {
		t.Fatal(err)
	}
	loaded := time.Since(start)
	var ok []*packages.Package
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			// Its build fails, and go test reports that elsewhere.
			t.Logf("skipping %s: %v", p.PkgPath, p.Errors[0])
			continue
		}
		ok = append(ok, p)
	}
	if len(ok) == 0 {
		t.Fatal("no packages loaded")
	}
	g, err := checker.Analyze(idemvet.Analyzers(), ok, nil)
	if err != nil {
		t.Fatal(err)
	}
	for act := range g.All() {
		if !act.IsRoot {
			continue
		}
		if act.Err != nil {
			t.Errorf("%s on %s: %v", act.Analyzer.Name, act.Package.PkgPath, act.Err)
		}
		for _, d := range act.Diagnostics {
			t.Errorf("%s: %s (%s)", act.Package.Fset.Position(d.Pos), d.Message, act.Analyzer.Name)
		}
	}
	t.Logf("%d packages: loaded in %v, analyzed in %v", len(ok), loaded.Round(time.Millisecond), (time.Since(start) - loaded).Round(time.Millisecond))
}

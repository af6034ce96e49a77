package golangci_test

import (
	"testing"

	"github.com/golangci/plugin-module-register/register"

	"github.com/idemkit/idem/idemvet"
	_ "github.com/idemkit/idem/idemvet/golangci"
)

func TestPlugin(t *testing.T) {
	newPlugin, err := register.GetPlugin("idemvet")
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlugin(map[string]any{"disable": []string{"idemfloatmoney"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.GetLoadMode() != register.LoadModeTypesInfo {
		t.Errorf("load mode %q", p.GetLoadMode())
	}
	as, err := p.BuildAnalyzers()
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != len(idemvet.Analyzers())-1 {
		t.Errorf("got %d analyzers, want all but one", len(as))
	}
	for _, a := range as {
		if a.Name == "idemfloatmoney" {
			t.Error("idemfloatmoney not disabled")
		}
	}
	if _, err := newPlugin(map[string]any{"disable": []string{"nosuchrule"}}); err == nil {
		t.Error("unknown rule accepted")
	}
	if _, err := newPlugin(nil); err != nil {
		t.Errorf("no settings: %v", err)
	}
}

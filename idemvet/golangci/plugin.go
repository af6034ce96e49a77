// Package golangci registers the idemvet analyzers as a golangci-lint module
// plugin named "idemvet". Build a custom golangci-lint that imports it (see
// docs/idemvet.md) and enable the linter; the setting "disable" lists rules
// to switch off by name (disable: ["idemfloatmoney"]).
package golangci

import (
	"fmt"
	"slices"

	"github.com/golangci/plugin-module-register/register"
	"golang.org/x/tools/go/analysis"

	"github.com/idemkit/idem/idemvet"
)

func init() {
	register.Plugin("idemvet", New)
}

// Settings are the plugin's settings in .golangci.yml.
type Settings struct {
	// Disable names the rules not to run.
	Disable []string `json:"disable"`
}

// Plugin is the idemvet golangci-lint plugin.
type Plugin struct {
	settings Settings
}

// New returns the plugin for the settings golangci-lint passes.
func New(settings any) (register.LinterPlugin, error) {
	s, err := register.DecodeSettings[Settings](settings)
	if err != nil {
		return nil, fmt.Errorf("idemvet: %w", err)
	}
	names := make([]string, 0, len(idemvet.Analyzers()))
	for _, a := range idemvet.Analyzers() {
		names = append(names, a.Name)
	}
	for _, d := range s.Disable {
		if !slices.Contains(names, d) {
			return nil, fmt.Errorf("idemvet: disable: unknown rule %q (rules: %v)", d, names)
		}
	}
	return &Plugin{settings: s}, nil
}

// BuildAnalyzers returns the analyzers not disabled.
func (p *Plugin) BuildAnalyzers() ([]*analysis.Analyzer, error) {
	var out []*analysis.Analyzer
	for _, a := range idemvet.Analyzers() {
		if !slices.Contains(p.settings.Disable, a.Name) {
			out = append(out, a)
		}
	}
	return out, nil
}

// GetLoadMode says the analyzers need type information.
func (p *Plugin) GetLoadMode() string { return register.LoadModeTypesInfo }

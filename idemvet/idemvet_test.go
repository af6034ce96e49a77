package idemvet_test

import (
	"testing"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/idemkit/idem/idemvet"
)

// all runs every analyzer in one pass, so the test data is loaded and
// type-checked once (net/http and database/sql from source take seconds).
// Every rule's diagnostics must match the want comments of every package:
// a rule reporting in another rule's package, or in the idiomatic package,
// fails the test.
var all = &analysis.Analyzer{
	Name: "idemvetall",
	Doc:  "all idemvet analyzers",
	Run: func(pass *analysis.Pass) (any, error) {
		for _, a := range idemvet.Analyzers() {
			p := *pass
			p.Analyzer = a
			if _, err := a.Run(&p); err != nil {
				return nil, err
			}
		}
		return nil, nil
	},
}

func TestAnalyzers(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), all,
		"producer", "retrykey", "randomid", "txwrite", "consumer", "floatmoney", "autocommit", "checkinsert", "staticid", "idiomatic", "ignore", "pgxv4",
		"producersarama", "producersaramaok", "producersaramafield", "github.com/IBM/sarama", "producerconfluent", "producerconfluentok", "producerkafkago", "producerkafkagoset",
		"producerkafkagozero", "producerkafkagozeroset", "producerkafkagozeromain", "produceracks",
		"consumerother", "commitorder", "confluentauto", "confluentmanual", "retrykeyother")
}

func TestAnalyzersValid(t *testing.T) {
	if err := analysis.Validate(idemvet.Analyzers()); err != nil {
		t.Fatal(err)
	}
	names := make(map[string]bool)
	for _, a := range idemvet.Analyzers() {
		if names[a.Name] {
			t.Errorf("duplicate analyzer name %q", a.Name)
		}
		names[a.Name] = true
		if len(a.Requires) != 0 {
			t.Errorf("%s: requires other analyzers; the all analyzer of this test does not run them", a.Name)
		}
	}
}

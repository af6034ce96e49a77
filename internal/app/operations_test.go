package app

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/orders"
)

// exercisedMetrics is what idemd registers: every hook called once, and
// one request through the access log, so that the vectors without
// initial children have a series to gather.
func exercisedMetrics() *metrics {
	m := newMetrics()
	a := &App{metrics: m, log: slog.New(slog.DiscardHandler)}
	a.observe(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).
		ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/livez", nil))
	m.outcome(nil, idemhttp.OutcomeExecuted)
	m.sweep(cleanup.Report{Tables: []cleanup.TableReport{{Table: cleanup.TableInbox, Deleted: 1}}})
	m.lag(time.Second)
	m.park(event.Envelope{}, 1, errors.New("poison"))
	m.relayLease(true)
	m.groupLag.WithLabelValues(SagaGroup).Set(1) // kafkalag.go
	m.batch(ProjectionInbox, idemkafka.BatchStats{Applied: 1})
	m.watchdog(orders.WatchdogStats{Stuck: 1, Operator: 1, Waiting: 1})
	return m
}

// TestOperationsMetrics keeps the metrics table of docs/operations.md true
// to what idemd serves at /metrics: every idemd_ metric registered is in
// the table with its type and labels, the table names no metric idemd does
// not have, and every idemd_ name the runbook uses elsewhere (its alert
// expressions) is one idemd has.
func TestOperationsMetrics(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	type metric struct {
		typ    string
		labels []string
	}

	// The table: | `idemd_name` | type | `label`, `label` | meaning |,
	// in the section "## Metrics".
	documented := map[string]metric{}
	section := false
	backticked := regexp.MustCompile("`([^`]*)`")
	for line := range strings.SplitSeq(string(doc), "\n") {
		if strings.HasPrefix(line, "## ") {
			section = line == "## Metrics"
		}
		if !section || !strings.HasPrefix(line, "| `idemd_") {
			continue
		}
		cols := strings.Split(line, "|") // "", name, type, labels, meaning, ""
		if len(cols) < 5 {
			t.Errorf("docs/operations.md: metrics row %q has fewer than 4 columns", line)
			continue
		}
		name := strings.Trim(strings.TrimSpace(cols[1]), "`")
		var labels []string
		for _, m := range backticked.FindAllStringSubmatch(cols[3], -1) {
			labels = append(labels, m[1])
		}
		slices.Sort(labels)
		if _, dup := documented[name]; dup {
			t.Errorf("docs/operations.md: %s has two rows", name)
		}
		documented[name] = metric{typ: strings.TrimSpace(cols[2]), labels: labels}
	}
	if len(documented) < 5 {
		t.Fatalf("read %d metrics from docs/operations.md's table; the parser no longer matches it", len(documented))
	}

	m := exercisedMetrics()
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]metric{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "idemd_") {
			continue
		}
		var labels []string
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		slices.Sort(labels)
		registered[f.GetName()] = metric{typ: strings.ToLower(f.GetType().String()), labels: labels}
	}
	// A metric added to the struct whose hook this test does not call
	// would have no series and go unseen: count the collectors (one
	// metric each; the replay caches' collector describes several).
	collector := reflect.TypeFor[prometheus.Collector]()
	described := 0
	for f := range reflect.TypeFor[metrics]().Fields() {
		switch {
		case !f.Type.Implements(collector) || f.Type == reflect.TypeFor[*prometheus.Registry]():
		case f.Type == reflect.TypeFor[*cacheCollector]():
			descs := make(chan *prometheus.Desc, 16)
			m.caches.Describe(descs)
			described += len(descs)
		default:
			described++
		}
	}
	if described != len(registered) {
		t.Fatalf("the metrics struct's collectors describe %d metrics, the registry gathered %d idemd_ metrics: call the new metric's hook above",
			described, len(registered))
	}

	for name, r := range registered {
		d, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("idemd registers %s (%s, labels %v), which docs/operations.md's metrics table does not document", name, r.typ, r.labels)
		case d.typ != r.typ:
			t.Errorf("docs/operations.md: %s is a %s, the table says %q", name, r.typ, d.typ)
		case !slices.Equal(d.labels, r.labels):
			t.Errorf("docs/operations.md: %s has the labels %v, the table says %v", name, r.labels, d.labels)
		}
	}
	for name := range documented {
		if _, ok := registered[name]; !ok {
			t.Errorf("docs/operations.md documents %s, which idemd does not register", name)
		}
	}
	// Every name the runbook uses, in its alerts as anywhere else, and
	// every one the README, the other docs and the package doc name
	// (idemd_instance is a table).
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range append(files, "../../README.md", "doc.go") {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range slices.Compact(slices.Sorted(slices.Values(regexp.MustCompile(`idemd_[a-z_]+`).FindAllString(string(text), -1)))) {
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suffix); ok && registered[b].typ == "histogram" {
					base = b
				}
			}
			if _, ok := registered[base]; !ok && name != "idemd_instance" {
				t.Errorf("%s uses %s, which idemd does not register", strings.TrimPrefix(file, "../../"), name)
			}
		}
	}
}

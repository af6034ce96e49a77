package app

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// stallCollector is idemd_kafka_consumer_stalled_seconds: each consumer's
// idemkafka.Consumer.Stalled, read when scraped, so that it grows while a
// partition is stuck behind one record (0 before the consumer is set up).
type stallCollector struct {
	consumers map[string]*atomic.Pointer[func() time.Duration] // by inbox name
	desc      *prometheus.Desc
}

func newStallCollector(consumers ...string) *stallCollector {
	m := make(map[string]*atomic.Pointer[func() time.Duration], len(consumers))
	for _, c := range consumers {
		m[c] = new(atomic.Pointer[func() time.Duration])
	}
	return &stallCollector{consumers: m, desc: prometheus.NewDesc("idemd_kafka_consumer_stalled_seconds",
		"How long this replica's longest-stalled partition of the consumer has applied nothing: its next record keeps failing on a database fault (retried for ever, never dead-lettered); 0 when every partition moves.",
		[]string{"consumer"}, nil)}
}

// use makes stalled the consumer's measure.
func (c *stallCollector) use(consumer string, stalled func() time.Duration) {
	c.consumers[consumer].Store(&stalled)
}

// Describe implements prometheus.Collector.
func (c *stallCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *stallCollector) Collect(ch chan<- prometheus.Metric) {
	for consumer, p := range c.consumers {
		var d time.Duration
		if f := p.Load(); f != nil {
			d = (*f)()
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, d.Seconds(), consumer)
	}
}

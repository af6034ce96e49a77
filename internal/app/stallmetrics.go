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

// resetCollector is idemd_kafka_consumer_offset_resets_total: each
// consumer's idemkafka.Consumer.OffsetResets, read when scraped (0 before
// the consumer is set up).
type resetCollector struct {
	consumers map[string]*atomic.Pointer[func() int64] // by inbox name
	desc      *prometheus.Desc
}

func newResetCollector(consumers ...string) *resetCollector {
	m := make(map[string]*atomic.Pointer[func() int64], len(consumers))
	for _, c := range consumers {
		m[c] = new(atomic.Pointer[func() int64])
	}
	return &resetCollector{consumers: m, desc: prometheus.NewDesc("idemd_kafka_consumer_offset_resets_total",
		"Times a partition of the consumer found the records at its offset gone (OFFSET_OUT_OF_RANGE: deleted by retention or DeleteRecords before they were applied, or lost by the broker) and resumed at the log start: the records in between were never applied.",
		[]string{"consumer"}, nil)}
}

// use makes resets the consumer's count.
func (c *resetCollector) use(consumer string, resets func() int64) {
	c.consumers[consumer].Store(&resets)
}

// Describe implements prometheus.Collector.
func (c *resetCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *resetCollector) Collect(ch chan<- prometheus.Metric) {
	for consumer, p := range c.consumers {
		var n int64
		if f := p.Load(); f != nil {
			n = (*f)()
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), consumer)
	}
}

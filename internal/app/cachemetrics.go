package app

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/idemhttp"
)

// cacheCollector exports the replay caches' counters of idemd's
// idempotency middlewares (one per endpoint), read from
// idemhttp.Middleware.CacheStats at each scrape: nothing is counted on the
// request path. Each endpoint is exported from the start, at zero until
// its middleware is set (use).
type cacheCollector struct {
	caches   map[string]*atomic.Pointer[func() idemhttp.CacheStats] // by endpoint
	hits     *prometheus.Desc
	misses   *prometheus.Desc
	evicted  *prometheus.Desc
	entries  *prometheus.Desc
	bytes    *prometheus.Desc
	maxBytes *prometheus.Desc
}

func newCacheCollector(endpoints ...string) *cacheCollector {
	l := []string{"endpoint"}
	caches := make(map[string]*atomic.Pointer[func() idemhttp.CacheStats], len(endpoints))
	for _, e := range endpoints {
		caches[e] = new(atomic.Pointer[func() idemhttp.CacheStats])
	}
	return &cacheCollector{
		caches: caches,
		hits: prometheus.NewDesc("idemd_http_replay_cache_hits_total",
			"Protected requests answered from the replay cache (a replay, or a key reused with another body), by endpoint.", l, nil),
		misses: prometheus.NewDesc("idemd_http_replay_cache_misses_total",
			"Replay cache lookups that found no live entry (the request went to the database), by endpoint.", l, nil),
		evicted: prometheus.NewDesc("idemd_http_replay_cache_evictions_total",
			"Replay cache entries dropped to stay within its memory budget, by endpoint.", l, nil),
		entries: prometheus.NewDesc("idemd_http_replay_cache_entries",
			"Completed responses the replay cache holds now, by endpoint.", l, nil),
		bytes: prometheus.NewDesc("idemd_http_replay_cache_bytes",
			"Memory the replay cache's entries take now, by endpoint (never above idemd_http_replay_cache_max_bytes).", l, nil),
		maxBytes: prometheus.NewDesc("idemd_http_replay_cache_max_bytes",
			"The replay cache's memory budget, by endpoint.", l, nil),
	}
}

// use exports the cache whose counters stats returns as endpoint's, one
// of those newCacheCollector was given.
func (c *cacheCollector) use(endpoint string, stats func() idemhttp.CacheStats) {
	c.caches[endpoint].Store(&stats)
}

// Describe implements prometheus.Collector.
func (c *cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.hits, c.misses, c.evicted, c.entries, c.bytes, c.maxBytes} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *cacheCollector) Collect(ch chan<- prometheus.Metric) {
	for endpoint, p := range c.caches {
		var s idemhttp.CacheStats
		if stats := p.Load(); stats != nil {
			s = (*stats)()
		}
		ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, float64(s.Hits), endpoint)
		ch <- prometheus.MustNewConstMetric(c.misses, prometheus.CounterValue, float64(s.Misses), endpoint)
		ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(s.Evictions), endpoint)
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(s.Entries), endpoint)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(s.Bytes), endpoint)
		ch <- prometheus.MustNewConstMetric(c.maxBytes, prometheus.GaugeValue, float64(s.MaxBytes), endpoint)
	}
}

package app

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/orders"
)

// metrics are idemd's Prometheus metrics, in a registry of their own (no
// global state: several apps can run in one test binary).
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	outcomes *prometheus.CounterVec
	sweeps   *prometheus.CounterVec
	deleted  *prometheus.CounterVec
	lagSecs  prometheus.Gauge
	parked   prometheus.Counter
	// parkedNow is the events parked in the outbox now, counted every
	// parkedInterval (parked.go).
	parkedNow prometheus.Gauge
	active    prometheus.Gauge
	// groupLag and lagFailures are the consumer groups' lag, measured
	// every kafkaLagInterval (kafkalag.go), and its failed measurements.
	groupLag    *prometheus.GaugeVec
	lagFailures *prometheus.CounterVec
	events      *prometheus.CounterVec
	stuck       *prometheus.CounterVec
	operator    prometheus.Gauge
	waiting     prometheus.Gauge
	// caches are the replay caches of the idempotency middlewares, read
	// when scraped.
	caches *cacheCollector
	// stalled is each consumer's Stalled, read when scraped.
	stalled *stallCollector
	// resets is each consumer's OffsetResets, read when scraped.
	resets *resetCollector
}

// requestBuckets are idemd_http_request_duration_seconds' buckets:
// Prometheus' default ones (5 ms to 10 s, for commands, and a duplicate
// waiting up to 5 s for its key) and, below them, the 100 µs to 2.5 ms a
// replay from the replay cache, a read or a command on an idle database
// takes; with the default ones alone all of those fell in the first
// bucket, whose median PromQL reads as 2.5 ms.
var requestBuckets = append([]float64{.0001, .00025, .0005, .001, .0025}, prometheus.DefBuckets...)

func newMetrics() *metrics {
	m := &metrics{
		reg:     prometheus.NewRegistry(),
		caches:  newCacheCollector("payments", "orders"),
		stalled: newStallCollector(ProjectionInbox, SagaInbox),
		resets:  newResetCollector(ProjectionInbox, SagaInbox),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_http_requests_total",
			Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemd_http_request_duration_seconds",
			Help:    "HTTP request duration by route pattern.",
			Buckets: requestBuckets,
		}, []string{"route"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_http_outcomes_total",
			Help: "What the idempotency middleware did with protected requests.",
		}, []string{"outcome"}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_cleanup_sweeps_total",
			Help: "Retention sweeps by result: done, skipped (another replica sweeps), interrupted (cut short by the shutdown), failed.",
		}, []string{"result"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_cleanup_deleted_rows_total",
			Help: "Rows the retention sweep deleted, by table.",
		}, []string{"table"}),
		lagSecs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_outbox_lag_seconds",
			Help: "Age of the oldest unpublished outbox event (0 when none), after the relay's last round, and every second while a round is stuck.",
		}),
		parked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_outbox_parked_total",
			Help: "Outbox events this replica's relay parked as poison (Kafka can never take them); each blocks the later events of its key until unparked.",
		}),
		parkedNow: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_outbox_parked_events",
			Help: "Outbox events parked now (the whole database's, whichever replica parked them): each blocks the later events of its key until an operator unparks it. Counted at start, every 10s and after each park by this replica; kept at its last value while the count fails.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_outbox_relay_active",
			Help: "1 while this replica's outbox relay publishes, 0 while it stands by (SQLite: another replica holds the relay lease, or the lease cannot be reached) or is not running. On PostgreSQL every running relay publishes.",
		}),
		groupLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemd_kafka_consumer_lag",
			Help: "Records of the events' topic not yet consumed by a consumer group (end offset minus committed offset, summed over the partitions), measured every 10s; kept at its last value while the measurement fails.",
		}, []string{"group"}),
		lagFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_kafka_consumer_lag_failures_total",
			Help: "Measurements of a consumer group's lag that failed (the broker did not answer, the topic is missing): idemd_kafka_consumer_lag keeps its last value meanwhile.",
		}, []string{"group"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_inbox_events_total",
			Help: "Events the consumers handled, by consumer (inbox name) and result: applied, duplicate, dead_lettered.",
		}, []string{"consumer", "result"}),
		stuck: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_order_watchdog_orders_total",
			Help: "Orders the stuck-order watchdog acted on, by action: redriven (events published again), aborted (nothing charged; REJECTED). The orders it cannot act on are the gauges idemd_orders_needing_operator and idemd_orders_waiting_for_events.",
		}, []string{"action"}),
		operator: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_orders_needing_operator",
			Help: "Orders with a captured payment or a failed saga that stayed CREATED past -saga-give-up-after, or whose saga was aborted but is still compensating a watchdog round later, at the watchdog's last complete round (the whole database's: aggregate replicas with max).",
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_orders_waiting_for_events",
			Help: "Orders past -saga-give-up-after not given up because the outbox holds unpublished events older than them (the relay or Kafka is down or behind, or an event is parked), or held them less than -saga-give-up-after ago (or idemd started less than that ago), at the watchdog's last complete round (the whole database's: aggregate replicas with max).",
		}),
	}
	for _, r := range []string{"redriven", "aborted"} {
		m.stuck.WithLabelValues(r)
	}
	for _, c := range []string{ProjectionInbox, SagaInbox} {
		for _, r := range []string{"applied", "duplicate", "dead_lettered"} {
			m.events.WithLabelValues(c, r)
		}
	}
	for _, r := range []string{"done", "skipped", "interrupted", "failed"} {
		m.sweeps.WithLabelValues(r)
	}
	for _, t := range []string{cleanup.TableRecords, cleanup.TableInbox, cleanup.TableOutbox, cleanup.TableSagas} {
		m.deleted.WithLabelValues(t)
	}
	for _, g := range []string{ProjectionGroup, SagaGroup} {
		m.lagFailures.WithLabelValues(g)
	}
	for o := idemhttp.OutcomeExecuted; o <= idemhttp.OutcomeAbandoned; o++ {
		m.outcomes.WithLabelValues(o.String()) // export zeros
	}
	m.reg.MustRegister(m.requests, m.duration, m.outcomes, m.sweeps, m.deleted, m.lagSecs, m.parked, m.parkedNow, m.active, m.groupLag, m.lagFailures, m.events, m.stuck, m.operator, m.waiting, m.caches, m.stalled, m.resets,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// outcome is idemhttp's Config.OnOutcome.
func (m *metrics) outcome(_ *http.Request, o idemhttp.Outcome) {
	m.outcomes.WithLabelValues(o.String()).Inc()
}

// sweep is cleanup's Config.OnSweep.
func (m *metrics) sweep(rep cleanup.Report) {
	result := "done"
	for _, t := range rep.Tables {
		m.deleted.WithLabelValues(t.Table).Add(float64(t.Deleted))
	}
	switch {
	case rep.Interrupted: // the shutdown: nothing to alert on
		result = "interrupted"
	case rep.Err != nil: // a table's failure, or the lease's
		result = "failed"
	case rep.Skipped:
		result = "skipped"
	}
	m.sweeps.WithLabelValues(result).Inc()
}

// watchdog is the watchdog's OnRound: the counters count what every round
// did, a failed one's included (its aborts are committed, and no later
// round counts them); the gauges are set from complete rounds only (a
// partial count would clear an operator alert).
func (m *metrics) watchdog(s orders.WatchdogStats) {
	m.stuck.WithLabelValues("redriven").Add(float64(s.Stuck))
	m.stuck.WithLabelValues("aborted").Add(float64(s.Aborted))
	if s.Partial {
		return
	}
	m.operator.Set(float64(s.Operator))
	m.waiting.Set(float64(s.Waiting))
}

// lag is outbox's RelayConfig.OnLag.
func (m *metrics) lag(d time.Duration) { m.lagSecs.Set(d.Seconds()) }

// park is outbox's RelayConfig.OnPark.
func (m *metrics) park(event.Envelope, int, error) { m.parked.Inc() }

// relayLease is outbox's RelayConfig.OnLease.
func (m *metrics) relayLease(held bool) {
	if held {
		m.active.Set(1)
	} else {
		m.active.Set(0)
	}
}

// batch counts what a consumer's batch did; consumer is its inbox name.
func (m *metrics) batch(consumer string, s idemkafka.BatchStats) {
	m.events.WithLabelValues(consumer, "applied").Add(float64(s.Applied))
	m.events.WithLabelValues(consumer, "duplicate").Add(float64(s.Duplicates))
	m.events.WithLabelValues(consumer, "dead_lettered").Add(float64(s.DeadLettered))
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

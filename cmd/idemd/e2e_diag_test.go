package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// pipeline describes where a scenario's events are, for the report of
// invariants that do not hold: the outbox's pending events (PostgreSQL),
// each consumer group's state and, per partition of the events' topic, its
// committed offset against the end offset, and the pipeline's metrics of
// the running idemds. A part that cannot be read says why.
type pipeline struct {
	db    *pgDatabase // nil: SQLite, not read
	seeds []string    // of the Kafka cluster; none: not read
	topic string
	procs func() []*proc
}

var pipelineMetricRe = regexp.MustCompile(`(?m)^idemd_(kafka_consumer_lag|outbox_lag_seconds|outbox_relay_active|outbox_parked_events|orders_waiting_for_events|orders_needing_operator|order_watchdog_orders_total|inbox_events_total)\b.*$`)

func (p *pipeline) describe(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var b strings.Builder
	b.WriteString("where the events are:\n")
	if p.db != nil {
		var pending, parked, backingOff int
		err := p.db.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE parked_at IS NOT NULL),
			count(*) FILTER (WHERE parked_at IS NULL AND attempts > 0) FROM outbox_pending`).Scan(&pending, &parked, &backingOff)
		if err != nil {
			fmt.Fprintf(&b, "  outbox: %v\n", err)
		} else {
			fmt.Fprintf(&b, "  outbox: %d events pending (%d parked, %d backing off)\n", pending, parked, backingOff)
		}
	}
	if len(p.seeds) > 0 {
		b.WriteString(p.kafka(ctx))
	}
	if p.procs != nil {
		hc := &http.Client{Timeout: 5 * time.Second}
		for _, pr := range p.procs() {
			if !pr.running() {
				fmt.Fprintf(&b, "  %s: not running\n", pr.name)
				continue
			}
			resp, err := hc.Get(pr.base + "/metrics")
			if err != nil {
				fmt.Fprintf(&b, "  %s metrics: %v\n", pr.name, err)
				continue
			}
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				fmt.Fprintf(&b, "  %s metrics: %v\n", pr.name, err)
				continue
			}
			for _, m := range pipelineMetricRe.FindAllString(string(body), -1) {
				fmt.Fprintf(&b, "  %s %s\n", pr.name, m)
			}
		}
	}
	return b.String()
}

// kafka describes the consumer groups of the cluster: state, members and,
// per partition of the topic, the committed offset against the end offset.
func (p *pipeline) kafka(ctx context.Context) string {
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.seeds...), kgo.RequestRetries(2))
	if err != nil {
		return fmt.Sprintf("  kafka: %v\n", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var b strings.Builder
	ends, err := adm.ListEndOffsets(ctx, p.topic)
	if err != nil {
		return fmt.Sprintf("  kafka: end offsets of %s: %v\n", p.topic, err)
	}
	fmt.Fprintf(&b, "  topic %s end offsets:", p.topic)
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			fmt.Fprintf(&b, " p%d=%v", o.Partition, o.Err)
		} else {
			fmt.Fprintf(&b, " p%d=%d", o.Partition, o.Offset)
		}
	})
	b.WriteString("\n")
	listed, err := adm.ListGroups(ctx)
	if err != nil {
		fmt.Fprintf(&b, "  kafka: list groups: %v\n", err)
		return b.String()
	}
	groups := listed.Groups()
	slices.Sort(groups)
	described, err := adm.DescribeGroups(ctx, groups...)
	if err != nil {
		fmt.Fprintf(&b, "  kafka: describe groups: %v\n", err)
	}
	for _, g := range groups {
		d := described[g]
		fmt.Fprintf(&b, "  group %s: state %s, %d members", g, d.State, len(d.Members))
		if d.Err != nil {
			fmt.Fprintf(&b, " (%v)", d.Err)
		}
		offs, err := adm.FetchOffsets(ctx, g)
		if err != nil {
			fmt.Fprintf(&b, "; offsets: %v\n", err)
			continue
		}
		b.WriteString("; committed/end:")
		ends.Each(func(o kadm.ListedOffset) {
			c, ok := offs.Lookup(p.topic, o.Partition)
			switch {
			case !ok:
				fmt.Fprintf(&b, " p%d=none/%d", o.Partition, o.Offset)
			case c.Err != nil:
				fmt.Fprintf(&b, " p%d=%v", o.Partition, c.Err)
			default:
				fmt.Fprintf(&b, " p%d=%d/%d", o.Partition, c.At, o.Offset)
			}
		})
		b.WriteString("\n")
	}
	return b.String()
}

// nonEmpty is the list of s, or none when s is empty.
func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

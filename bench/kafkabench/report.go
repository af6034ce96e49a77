package main

import (
	"fmt"
	"os"
	"slices"
	"text/tabwriter"
)

// printConsumerTable prints medians over rounds and the targets.
func printConsumerTable(scs []*scenario, o options) {
	byID := map[string]*scenario{}
	for _, sc := range scs {
		byID[sc.id] = sc
	}
	med := func(sc *scenario, f func(runResult) float64) float64 {
		xs := make([]float64, len(sc.runs))
		for i, r := range sc.runs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintln(tw, "scenario\t\tworkers\tbatch\tevents/run\tevents/s\t(min..max)\tfsync/s\tevents/fsync\tcommits/s\tWAL B/event\tchecks\t")
	for _, sc := range scs {
		batch := o.batch
		if sc.single {
			batch = 1
		}
		eps := make([]float64, len(sc.runs))
		ok := 0
		for i, r := range sc.runs {
			eps[i] = r.eps
			if r.ok {
				ok++
			}
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.0f\t(%.0f..%.0f)\t%.0f\t%.1f\t%.0f\t%.0f\t%d/%d ok\t\n",
			sc.id, sc.name+" ", sc.workers, batch, sc.n,
			median(eps), slices.Min(eps), slices.Max(eps),
			med(sc, func(r runResult) float64 { return float64(r.c.walSync) / r.elapsed.Seconds() }),
			med(sc, func(r runResult) float64 { return float64(r.events) / max(float64(r.c.walSync), 1) }),
			med(sc, func(r runResult) float64 { return float64(r.c.commits) / r.elapsed.Seconds() }),
			med(sc, func(r runResult) float64 { return r.c.walBytes / float64(r.events) }),
			ok, len(sc.runs))
	}
	_ = tw.Flush()
	fmt.Println("events/s: median over rounds; fsync/s: pg_stat_wal.wal_sync during the run (cluster-wide: other sessions count too);")
	fmt.Println("commits/s: pg_stat_database.xact_commit of this database; WAL B/event: pg_stat_wal.wal_bytes (cluster-wide)")
	fmt.Println()

	ratio := func(num, den string) (float64, bool) {
		n, d := byID[num], byID[den]
		if n == nil || d == nil {
			return 0, false
		}
		rs := make([]float64, min(len(n.runs), len(d.runs)))
		for i := range rs {
			rs[i] = n.runs[i].eps / d.runs[i].eps
		}
		return median(rs), len(rs) > 0
	}
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "MISS"
	}
	targets := []struct {
		num, den string
		min      float64
		note     string
	}{
		{"b", "a", 5, "batched inbox vs one transaction per event"},
		{"b", "c", 0.85, "what dedup costs a batch"},
		{"f", "c", 0.85, "informative: the floor, a bare uuid primary key as the dedup row"},
		{"b", "f", 0.85, "informative: idem's dedup against the floor's"},
		{"b2", "a", 5, "informative: effect batched too"},
		{"b2", "c2", 0.85, "informative: effect batched too"},
	}
	for _, t := range targets {
		if got, ok := ratio(t.num, t.den); ok {
			fmt.Printf("target %s/%s >= %.2f: %6.2f  %s  (%s; median of per-round ratios)\n", t.num, t.den, t.min, got, verdict(got >= t.min), t.note)
		}
	}
	for _, id := range []string{"b", "b2"} {
		if sc := byID[id]; sc != nil {
			eps := make([]float64, len(sc.runs))
			for i, r := range sc.runs {
				eps[i] = r.eps
			}
			note := "batched inbox"
			if id == "b2" {
				note = "informative: effect batched too"
			}
			got := median(eps)
			fmt.Printf("target %s >= 30000 events/s: %6.0f  %s  (%s; batch %d, %d workers)\n", id, got, verdict(got >= 30000), note, o.batch, sc.workers)
		}
	}
	// What the inbox adds to the WAL of a batch: the dedup scenario's WAL
	// per event minus that of the same batch without dedup.
	for _, p := range [][3]string{{"b", "c", "processed_event"}, {"f", "c", dedupFloorTable}, {"b2", "c2", "processed_event"}} {
		n, d := byID[p[0]], byID[p[1]]
		if n == nil || d == nil {
			continue
		}
		rs := make([]float64, min(len(n.runs), len(d.runs)))
		for i := range rs {
			rs[i] = n.runs[i].c.walBytes/float64(n.runs[i].events) - d.runs[i].c.walBytes/float64(d.runs[i].events)
		}
		fmt.Printf("dedup WAL %s-%s: %4.0f B/event  (informative: %s row and index entries; median of per-round differences)\n", p[0], p[1], median(rs), p[2])
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/uniq"
)

// benchEvent is a consumed event: what the handler needs of it.
type benchEvent struct {
	id      uuid.UUID
	account string
	amount  int64
}

// pgID is e.id as pgx encodes it natively. A uuid.UUID argument goes
// through pgx's database/sql Valuer fallback, which builds and drops an
// error per argument (6% of the consumer scenarios' CPU): a handler's cost,
// not idem's, so every scenario passes this.
func (e *benchEvent) pgID() pgtype.UUID { return pgtype.UUID{Bytes: e.id, Valid: true} }

// handler delivers one unit (one event for a, one poll's batch for the
// others) and reports how many events were applied and skipped.
type handler func(ctx context.Context, x *exec, unit []*benchEvent) (applied, dups int, err error)

// exec is what a handler runs on: one pool per scenario run.
type exec struct {
	pool *pgxpool.Pool
	drv  *pgdriver.Driver
	ib   *inbox.Inbox[pgx.Tx] // nil without dedup
}

// scenario is one way of consuming events.
type scenario struct {
	id, name string
	table    string // effect table
	consumer string // inbox consumer name; "" without dedup
	single   bool   // one event per unit (a) rather than batches
	floor    bool   // dedup rows in dedupFloorTable, not processed_event (f)
	workers  int
	n        int
	mk       func(table, consumer string) handler
	runs     []runResult
}

// runResult is one timed run of a scenario, with its checks.
type runResult struct {
	events  int
	elapsed time.Duration
	eps     float64
	applied int
	c       pgCounters

	effects, distinct int // after the timed run
	redelivered       int // events delivered again in the duplicate round
	redelivDups       int // of them, skipped by the inbox
	extra             int // effects the duplicate round added
	ok                bool
}

func (b *bench) scenarios(want map[string]bool) []*scenario {
	o := b.o
	all := []*scenario{
		{id: "a", name: "seed: 1 tx per event", table: "effect_a", consumer: "kafkabench-a", single: true, workers: o.workersA, n: o.nA, mk: seedHandler},
		{id: "b", name: "idem ProcessBatch, 1 INSERT per event", table: "effect_b", consumer: "kafkabench-b", workers: o.workers, n: o.n, mk: idemHandler},
		{id: "c", name: "as b, no dedup", table: "effect_c", workers: o.workers, n: o.n, mk: plainHandler},
		{id: "f", name: "floor: b's dedup as a bare uuid primary key", table: "effect_f", floor: true, workers: o.workers, n: o.n, mk: floorHandler},
		{id: "b2", name: "idem ProcessBulk, 1 INSERT per batch", table: "effect_b2", consumer: "kafkabench-b2", workers: o.workers, n: o.n, mk: idemBatchedHandler},
		{id: "c2", name: "as b2, no dedup", table: "effect_c2", workers: o.workers, n: o.n, mk: plainBatchedHandler},
	}
	var out []*scenario
	for _, sc := range all {
		if want[sc.id] {
			out = append(out, sc)
		}
	}
	return out
}

// effectSQL is the effect of one event: one ledger row.
func effectSQL(table string) string {
	return "INSERT INTO " + table + " (event_id, account, amount) VALUES ($1, $2, $3)"
}

// effectBatchSQL is the effect of a batch of events in one statement.
func effectBatchSQL(table string) string {
	return "INSERT INTO " + table + ` (event_id, account, amount)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[])`
}

// seedHandler is the common pattern: per event BEGIN; INSERT the dedup row
// ON CONFLICT DO NOTHING; if it was inserted, the effect; COMMIT.
func seedHandler(table, consumer string) handler {
	ins := `INSERT INTO processed_event (consumer_name, event_id, processed_at) VALUES ($1, $2, now())
		ON CONFLICT (consumer_name, event_id) DO NOTHING`
	eff := effectSQL(table)
	return func(ctx context.Context, x *exec, unit []*benchEvent) (int, int, error) {
		applied, dups := 0, 0
		for _, e := range unit {
			err := pgx.BeginFunc(ctx, x.pool, func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, ins, consumer, e.pgID())
				if err != nil {
					return err
				}
				if tag.RowsAffected() == 0 {
					dups++
					return nil
				}
				applied++
				_, err = tx.Exec(ctx, eff, e.pgID(), e.account, e.amount)
				return err
			})
			if err != nil {
				return 0, 0, err
			}
		}
		return applied, dups, nil
	}
}

// idemHandler is what an idemkafka.Consumer runs for a poll: ProcessBatch,
// whose handler (ConsumerConfig.Handler) writes each new event's effect
// with its own statement in the batch's transaction.
func idemHandler(table, _ string) handler {
	eff := effectSQL(table)
	return func(ctx context.Context, x *exec, unit []*benchEvent) (int, int, error) {
		evs := make([]inbox.Event, len(unit))
		for i, e := range unit {
			evs[i] = inbox.Event{ID: e.id, Payload: e}
		}
		res, err := x.ib.ProcessBatch(ctx, evs, func(ctx context.Context, tx pgx.Tx, ie inbox.Event) error {
			e := ie.Payload.(*benchEvent)
			_, err := tx.Exec(ctx, eff, e.pgID(), e.account, e.amount)
			return err
		})
		return res.Applied, res.Duplicates, err
	}
}

// plainHandler is idemHandler without the inbox: BEGIN, the same effect
// statement per event, COMMIT.
func plainHandler(table, _ string) handler {
	eff := effectSQL(table)
	return func(ctx context.Context, x *exec, unit []*benchEvent) (int, int, error) {
		err := pgx.BeginFunc(ctx, x.pool, func(tx pgx.Tx) error {
			for _, e := range unit {
				if _, err := tx.Exec(ctx, eff, e.pgID(), e.account, e.amount); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, 0, err
		}
		return len(unit), 0, nil
	}
}

// dedupFloorTable holds scenario f's dedup rows: the event ID alone, as
// its primary key (dedupFloorKey).
const dedupFloorTable = "dedup_floor"

// dedupFloorKey is dedupFloorTable's primary key: its violation is an ID
// recorded before.
var dedupFloorKey = uniq.Constraint{Name: "dedup_floor_pkey", Table: dedupFloorTable, Columns: []string{"event_id"}}

// floorHandler is the floor of any inbox that writes one durable dedup row
// per event in the effects' transaction: b with the cheapest such row, a
// bare uuid primary key (no consumer name, no processed_at and no index for
// a cleaner to find expired rows by), the batch's IDs sorted and written by
// one plain INSERT. If one was recorded before (the duplicate round), that
// transaction rolls back and the batch runs again with ON CONFLICT DO
// NOTHING RETURNING, applying the new events only. It is not a consumer
// anyone could run for long (its table only grows); it shows what b's
// dedup could cost at best.
func floorHandler(table, _ string) handler {
	eff := effectSQL(table)
	ins := `INSERT INTO ` + dedupFloorTable + ` (event_id) SELECT unnest($1::uuid[])`
	insNew := ins + ` ON CONFLICT DO NOTHING RETURNING event_id`
	return func(ctx context.Context, x *exec, unit []*benchEvent) (int, int, error) {
		raw := make([]uuid.UUID, len(unit))
		for i, e := range unit {
			raw[i] = e.id
		}
		sorted := driver.SortedUniqueIDs(raw)
		ids := make([]pgtype.UUID, len(sorted))
		for i, id := range sorted {
			ids[i] = pgtype.UUID{Bytes: id, Valid: true}
		}
		err := pgx.BeginFunc(ctx, x.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, ins, ids); err != nil {
				return err
			}
			for _, e := range unit {
				if _, err := tx.Exec(ctx, eff, e.pgID(), e.account, e.amount); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			return len(unit), 0, nil
		}
		if !uniq.Is(err, dedupFloorKey) {
			return 0, 0, err
		}
		applied, dups := 0, 0
		err = pgx.BeginFunc(ctx, x.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, insNew, ids)
			if err != nil {
				return err
			}
			fresh, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (uuid.UUID, error) {
				var id pgtype.UUID
				err := row.Scan(&id)
				return uuid.UUID(id.Bytes), err
			})
			if err != nil {
				return err
			}
			isNew := make(map[uuid.UUID]bool, len(fresh))
			for _, id := range fresh {
				isNew[id] = true
			}
			for _, e := range unit {
				if !isNew[e.id] {
					dups++
					continue
				}
				delete(isNew, e.id) // a later copy in the batch is a duplicate
				applied++
				if _, err := tx.Exec(ctx, eff, e.pgID(), e.account, e.amount); err != nil {
					return err
				}
			}
			return nil
		})
		return applied, dups, err
	}
}

// idemBatchedHandler batches the effect too, as an idemkafka.Consumer with
// a ConsumerConfig.BatchHandler does: inbox.ProcessBulk, whose function gets
// the batch's new events at once and writes all their effects with one
// INSERT ... SELECT FROM unnest, then COMMIT.
func idemBatchedHandler(table, _ string) handler {
	eff := effectBatchSQL(table)
	return func(ctx context.Context, x *exec, unit []*benchEvent) (int, int, error) {
		evs := make([]inbox.Event, len(unit))
		for i, e := range unit {
			evs[i] = inbox.Event{ID: e.id, Payload: e}
		}
		res, err := x.ib.ProcessBulk(ctx, evs, func(ctx context.Context, tx pgx.Tx, fresh []inbox.Event) error {
			batch := make([]*benchEvent, len(fresh))
			for i, ie := range fresh {
				batch[i] = ie.Payload.(*benchEvent)
			}
			return insertBatch(ctx, tx, eff, batch)
		})
		if err != nil {
			return 0, 0, err
		}
		return res.Applied, res.Duplicates, nil
	}
}

// plainBatchedHandler is idemBatchedHandler without the inbox.
func plainBatchedHandler(table, _ string) handler {
	eff := effectBatchSQL(table)
	return func(ctx context.Context, x *exec, unit []*benchEvent) (int, int, error) {
		err := pgx.BeginFunc(ctx, x.pool, func(tx pgx.Tx) error { return insertBatch(ctx, tx, eff, unit) })
		if err != nil {
			return 0, 0, err
		}
		return len(unit), 0, nil
	}
}

func insertBatch(ctx context.Context, tx pgx.Tx, sql string, evs []*benchEvent) error {
	ids := make([]pgtype.UUID, len(evs))
	accts := make([]string, len(evs))
	amts := make([]int64, len(evs))
	for i, e := range evs {
		ids[i] = pgtype.UUID{Bytes: e.id, Valid: true}
		accts[i] = e.account
		amts[i] = e.amount
	}
	_, err := tx.Exec(ctx, sql, ids, accts, amts)
	return err
}

// newEvents returns n fresh events (UUIDv7 IDs, as event.New gives).
func newEvents(n, accounts int, rng *mrand.Rand) ([]*benchEvent, error) {
	out := make([]*benchEvent, n)
	for i := range out {
		id, err := event.NewID()
		if err != nil {
			return nil, err
		}
		out[i] = &benchEvent{id: id, account: fmt.Sprintf("acct-%d", rng.IntN(accounts)), amount: int64(rng.IntN(10_000) + 1)}
	}
	return out, nil
}

// units cuts evs into deliveries: one event each, or batches of size.
func units(evs []*benchEvent, single bool, size int) [][]*benchEvent {
	if single {
		size = 1
	}
	var out [][]*benchEvent
	for lo := 0; lo < len(evs); lo += size {
		out = append(out, evs[lo:min(lo+size, len(evs))])
	}
	return out
}

// redeliveries is the duplicate round: every k-th event of evs again (a
// fraction frac of them), cut into units; a batch also carries a second
// copy of its first event, as a poll can.
func redeliveries(evs []*benchEvent, frac float64, single bool, size int) [][]*benchEvent {
	if frac <= 0 {
		return nil
	}
	k := max(int(1/frac+0.5), 1)
	var sample []*benchEvent
	for i := 0; i < len(evs); i += k {
		sample = append(sample, evs[i])
	}
	us := units(sample, single, size)
	if !single {
		for i, u := range us {
			us[i] = append(u[:len(u):len(u)], u[0])
		}
	}
	return us
}

// deliver runs us on workers goroutines (each takes the next unit) and
// returns the events applied and skipped.
func deliver(ctx context.Context, x *exec, h handler, us [][]*benchEvent, workers int) (applied, dups int, err error) {
	var (
		next     atomic.Int64
		nApplied atomic.Int64
		nDups    atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(us) || ctx.Err() != nil {
					return
				}
				a, d, err := h(ctx, x, us[i])
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
				nApplied.Add(int64(a))
				nDups.Add(int64(d))
			}
		})
	}
	wg.Wait()
	return int(nApplied.Load()), int(nDups.Load()), firstErr
}

// runConsumers runs every round, then prints the table and the targets.
func (b *bench) runConsumers(ctx context.Context, scs []*scenario) error {
	o := b.o
	fmt.Printf("consumer scenarios: %d rounds, each scenario once per round in a random order; batch=%d events; a: %d events, %d workers; b, c, b2, c2: %d events, %d workers\n",
		o.rounds, o.batch, o.nA, o.workersA, o.n, o.workers)
	fmt.Printf("effect: one ledger row per new event (INSERT into a table of its own per scenario); duplicate round: %.0f%% of each run's events redelivered\n\n", 100*o.dupFrac)
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for round := 1; round <= o.rounds; round++ {
		if err := b.truncate(ctx); err != nil {
			return err
		}
		for _, i := range rng.Perm(len(scs)) {
			sc := scs[i]
			r, err := b.runScenario(ctx, sc, rng)
			if err != nil {
				return fmt.Errorf("round %d, scenario %s: %w", round, sc.id, err)
			}
			sc.runs = append(sc.runs, r)
			fmt.Printf("round %d  %-3s %-42s %7d events in %7s = %8.0f events/s  %6.0f fsync/s  WAL %4.0f B/event  %s\n",
				round, sc.id, sc.name, r.events, r.elapsed.Round(time.Millisecond), r.eps, float64(r.c.walSync)/r.elapsed.Seconds(),
				r.c.walBytes/float64(r.events), r.check(sc))
		}
	}
	fmt.Println()
	printConsumerTable(scs, o)
	for _, sc := range scs {
		for _, r := range sc.runs {
			if !r.ok {
				return fmt.Errorf("scenario %s: the effect count check failed (see above)", sc.id)
			}
		}
	}
	return nil
}

// truncate empties the effect tables and the inbox, so that every round
// starts alike.
func (b *bench) truncate(ctx context.Context) error {
	_, err := b.admin.Exec(ctx, "TRUNCATE "+pgx.Identifier{b.schema, "processed_event"}.Sanitize()+", "+
		pgx.Identifier{b.schema, "effect_a"}.Sanitize()+", "+pgx.Identifier{b.schema, "effect_b"}.Sanitize()+", "+
		pgx.Identifier{b.schema, "effect_c"}.Sanitize()+", "+pgx.Identifier{b.schema, "effect_b2"}.Sanitize()+", "+
		pgx.Identifier{b.schema, "effect_c2"}.Sanitize()+", "+
		pgx.Identifier{b.schema, "effect_f"}.Sanitize()+", "+pgx.Identifier{b.schema, dedupFloorTable}.Sanitize())
	if err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	return nil
}

// runScenario times one run of sc on a pool of its own, then redelivers
// part of its events (untimed) and checks the effects.
func (b *bench) runScenario(ctx context.Context, sc *scenario, rng *mrand.Rand) (runResult, error) {
	var r runResult
	evs, err := newEvents(sc.n, b.o.accounts, rng)
	if err != nil {
		return r, err
	}
	h := sc.mk(sc.table, sc.consumer)
	us := units(evs, sc.single, b.o.batch)
	// A checkpoint now, so that full-page writes weigh on every run alike
	// rather than on whichever one a timed checkpoint falls in.
	if _, err := b.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return r, fmt.Errorf("checkpoint: %w", err)
	}
	x, err := b.exec(ctx, sc, sc.workers)
	if err != nil {
		return r, err
	}
	c0, err := b.counters(ctx)
	if err != nil {
		x.pool.Close()
		return r, err
	}
	start := time.Now()
	applied, _, err := deliver(ctx, x, h, us, sc.workers)
	r.elapsed = time.Since(start)
	if cerr := b.closePool(ctx, x.pool); err == nil {
		err = cerr
	}
	if err != nil {
		return r, err
	}
	c1, err := b.counters(ctx)
	if err != nil {
		return r, err
	}
	r.events, r.applied, r.c = len(evs), applied, c1.sub(c0)
	r.eps = float64(r.events) / r.elapsed.Seconds()

	tbl := pgx.Identifier{b.schema, sc.table}.Sanitize()
	if err := b.admin.QueryRow(ctx, "SELECT count(*), count(DISTINCT event_id) FROM "+tbl).Scan(&r.effects, &r.distinct); err != nil {
		return r, err
	}
	if b.o.dupFrac > 0 {
		dus := redeliveries(evs, b.o.dupFrac, sc.single, b.o.batch)
		for _, u := range dus {
			r.redelivered += len(u)
		}
		x, err := b.exec(ctx, sc, sc.workers)
		if err != nil {
			return r, err
		}
		_, r.redelivDups, err = deliver(ctx, x, h, dus, sc.workers)
		x.pool.Close()
		if err != nil {
			return r, fmt.Errorf("duplicate round: %w", err)
		}
		var after int
		if err := b.admin.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&after); err != nil {
			return r, err
		}
		r.extra = after - r.effects
	}
	r.ok = r.applied == r.events && r.effects == r.events && r.distinct == r.events
	if q, args, ok := sc.dedupRows(b.schema); ok {
		var rows int
		if err := b.admin.QueryRow(ctx, q, args...).Scan(&rows); err != nil {
			return r, err
		}
		r.ok = r.ok && rows == r.events && r.extra == 0 && r.redelivDups == r.redelivered
	} else {
		// Without dedup every redelivery is applied again: expected.
		r.ok = r.ok && r.extra == r.redelivered
	}
	return r, nil
}

// dedupRows returns the query counting sc's dedup rows in schema, and
// false for a scenario without dedup.
func (sc *scenario) dedupRows(schema string) (query string, args []any, ok bool) {
	switch {
	case sc.floor:
		return "SELECT count(*) FROM " + pgx.Identifier{schema, dedupFloorTable}.Sanitize(), nil, true
	case sc.consumer != "":
		return "SELECT count(*) FROM " + pgx.Identifier{schema, "processed_event"}.Sanitize() + " WHERE consumer_name = $1",
			[]any{sc.consumer}, true
	}
	return "", nil, false
}

func (b *bench) exec(ctx context.Context, sc *scenario, conns int) (*exec, error) {
	pool, drv, err := b.open(ctx, conns)
	if err != nil {
		return nil, err
	}
	x := &exec{pool: pool, drv: drv}
	if sc.consumer != "" {
		x.ib, err = inbox.New(drv, &inbox.Config{Consumer: sc.consumer, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			pool.Close()
			return nil, err
		}
	}
	return x, nil
}

// check describes the effect counts of r.
func (r runResult) check(sc *scenario) string {
	verdict := "ok"
	if !r.ok {
		verdict = "FAILED"
	}
	s := fmt.Sprintf("effects %d for %d events (%d distinct)", r.effects, r.events, r.distinct)
	if r.redelivered > 0 {
		if _, _, ok := sc.dedupRows(""); ok {
			s += fmt.Sprintf("; redelivered %d: %d skipped, %d extra effects", r.redelivered, r.redelivDups, r.extra)
		} else {
			s += fmt.Sprintf("; redelivered %d: %d extra effects (no dedup)", r.redelivered, r.extra)
		}
	}
	return s + " " + verdict
}

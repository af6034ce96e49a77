package cleanup_test

import (
	"errors"
	"github.com/idemkit/idem/driver"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// pnow is the clock of the partition tests: noon UTC, so the 72h cutoff
// falls in the middle of a day.
var pnow = time.Date(2031, 3, 14, 12, 0, 0, 0, time.UTC)

func day(i int) time.Time { return time.Date(2031, 3, 14+i, 0, 0, 0, 0, time.UTC) }

// v7At returns a random UUIDv7 of the millisecond t.
func v7At(t time.Time) uuid.UUID {
	id := uuid.New()
	b := pgdriver.InboxPartitionBound(t)
	copy(id[:6], b[:6])
	id[6] = 0x70 | id[6]&0x0f
	return id
}

func v7s(t time.Time, n int) []uuid.UUID {
	out := make([]uuid.UUID, n)
	for i := range out {
		out[i] = v7At(t.Add(time.Duration(i) * time.Second))
	}
	return out
}

// v4Outside returns a UUIDv4 whose first 48 bits fall in no day partition
// of this century.
func v4Outside() uuid.UUID {
	id := uuid.New()
	id[0] = 0xf0 | id[0]&0x0f
	return id
}

type pgInbox struct {
	t   *testing.T
	drv *pgdriver.Driver
}

func partitioned(t *testing.T) pgInbox {
	t.Helper()
	drv := testdb.Postgres(t)
	if err := drv.EnableInboxPartitioning(t.Context(), &pgdriver.PartitionOptions{Now: pnow, Behind: 6, Ahead: 3}); err != nil {
		t.Fatalf("EnableInboxPartitioning: %v", err)
	}
	return pgInbox{t, drv}
}

func (p pgInbox) insert(ids []uuid.UUID, at time.Time) {
	p.t.Helper()
	got, err := p.drv.Executor().InboxInsert(p.t.Context(), &driver.InboxInsertParams{Consumer: "c", IDs: ids, Now: at})
	if err != nil || len(got) != len(ids) {
		p.t.Fatalf("InboxInsert(%d ids at %s) = %d new, %v", len(ids), at, len(got), err)
	}
}

// present reports how many of ids are still recorded (InboxInsert in a
// rolled-back transaction returns the ones that are not).
func (p pgInbox) present(ids []uuid.UUID) int {
	p.t.Helper()
	ctx := p.t.Context()
	tx, err := p.drv.Begin(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	defer func() { _ = p.drv.Rollback(ctx, tx) }()
	fresh, err := p.drv.UnwrapExecutor(tx).InboxInsert(ctx, &driver.InboxInsertParams{Consumer: "c", IDs: ids, Now: pnow})
	if err != nil {
		p.t.Fatal(err)
	}
	return len(ids) - len(fresh)
}

// where returns the partition that holds id.
func (p pgInbox) where(id uuid.UUID) string {
	p.t.Helper()
	var rel string
	if err := p.drv.Pool().QueryRow(p.t.Context(), `SELECT tableoid::regclass::text FROM processed_event WHERE event_id = $1`, id).Scan(&rel); err != nil {
		p.t.Fatalf("locate %s: %v", id, err)
	}
	return rel
}

func (p pgInbox) partitions() []string {
	p.t.Helper()
	parts, err := p.drv.InboxPartitions(p.t.Context())
	if err != nil {
		p.t.Fatal(err)
	}
	var names []string
	for _, x := range parts {
		names = append(names, x.Name)
	}
	return names
}

func pname(i int) string { return "processed_event_p" + day(i).Format("20060102") }

func partitionCleaner(t *testing.T, drv *pgdriver.Driver, partitionedInbox bool) *cleanup.Cleaner[pgx.Tx] {
	t.Helper()
	c, err := cleanup.New(drv, &cleanup.Config{
		PartitionedInbox: partitionedInbox,
		PartitionsAhead:  5,
		Now:              func() time.Time { return pnow },
		BatchSize:        2,
		Pause:            cleanup.NoPause,
		Logger:           slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("cleanup.New: %v", err)
	}
	return c
}

func TestPartitionMode(t *testing.T) {
	t.Parallel()
	p := partitioned(t)
	if got, want := p.partitions(), []string{"processed_event_default", pname(-6), pname(-5), pname(-4), pname(-3), pname(-2), pname(-1), pname(0), pname(1), pname(2), pname(3)}; !slices.Equal(got, want) {
		t.Fatalf("partitions after EnableInboxPartitioning = %v; want %v", got, want)
	}
	// Whole days older than the 72h TTL (cutoff: day -3 at noon).
	dropped := append(v7s(day(-5).Add(time.Hour), 20), v7s(day(-4).Add(time.Hour), 10)...)
	p.insert(dropped[:20], day(-5).Add(2*time.Hour))
	p.insert(dropped[20:], day(-4).Add(2*time.Hour))
	// Day -3 straddles the cutoff: kept whole until it has ended.
	straddling := v7s(day(-3).Add(time.Hour), 5)
	p.insert(straddling, day(-3).Add(time.Hour))
	recent := v7s(day(-1), 10)
	p.insert(recent, day(-1).Add(time.Minute))
	// An event of day -5 processed an hour ago (a lagging consumer): its
	// day is dropped, the row is kept.
	lagging := v7s(day(-5).Add(3*time.Hour), 1)
	p.insert(lagging, pnow.Add(-time.Hour))
	// Ids that are not UUIDv7, and a UUIDv7 older than every partition, go
	// to the default partition and are deleted by processed_at.
	v4Old, v4Young, ancient := []uuid.UUID{v4Outside()}, []uuid.UUID{v4Outside()}, v7s(day(-30), 3)
	p.insert(v4Old, pnow.Add(-100*time.Hour))
	p.insert(v4Young, pnow.Add(-time.Hour))
	p.insert(ancient, day(-30))
	for _, id := range []uuid.UUID{v4Old[0], v4Young[0], ancient[0]} {
		if rel := p.where(id); rel != "processed_event_default" {
			t.Errorf("%s is stored in %s; want the default partition", id, rel)
		}
	}
	if rel := p.where(recent[0]); rel != pname(-1) {
		t.Errorf("a UUIDv7 of day -1 is stored in %s; want %s", rel, pname(-1))
	}

	rep, err := partitionCleaner(t, p.drv, true).RunOnce(t.Context())
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	in := rep.Tables[1]
	if in.Table != cleanup.TableInbox {
		t.Fatalf("second table swept is %s", in.Table)
	}
	if want := []string{pname(-6), pname(-5), pname(-4)}; !slices.Equal(in.PartitionsDropped, want) {
		t.Errorf("dropped %v; want %v", in.PartitionsDropped, want)
	}
	if want := []string{pname(4), pname(5)}; !slices.Equal(in.PartitionsCreated, want) {
		t.Errorf("created %v; want %v", in.PartitionsCreated, want)
	}
	if in.Rescued != 1 || in.Deleted != 4 || in.Batches != 3 {
		t.Errorf("rescued %d, deleted %d in %d batches; want 1 (lagging), 4 (old v4 + 3 ancient) in 3 batches of 2", in.Rescued, in.Deleted, in.Batches)
	}
	if n := p.present(dropped); n != 0 {
		t.Errorf("%d rows of dropped days still deduplicate", n)
	}
	if n := p.present(v4Old) + p.present(ancient); n != 0 {
		t.Errorf("%d old rows of the default partition left", n)
	}
	for name, ids := range map[string][]uuid.UUID{"straddling": straddling, "recent": recent, "lagging": lagging, "young v4": v4Young} {
		if n := p.present(ids); n != len(ids) {
			t.Errorf("%s: %d of %d rows deleted; want all kept", name, len(ids)-n, len(ids))
		}
	}
	if rel := p.where(lagging[0]); rel != "processed_event_default" {
		t.Errorf("the lagging row is in %s after its day was dropped; want the default partition", rel)
	}
	if got, want := p.partitions(), []string{"processed_event_default", pname(-3), pname(-2), pname(-1), pname(0), pname(1), pname(2), pname(3), pname(4), pname(5)}; !slices.Equal(got, want) {
		t.Errorf("partitions after the sweep = %v; want %v", got, want)
	}
}

// Creating a partition ahead moves the default partition's rows of that day
// into it.
func TestPartitionCreatedOverDefaultRows(t *testing.T) {
	t.Parallel()
	p := partitioned(t)
	future := v7s(day(7), 3)
	p.insert(future, pnow)
	if rel := p.where(future[0]); rel != "processed_event_default" {
		t.Fatalf("a UUIDv7 of day 7 is in %s before its partition exists", rel)
	}
	created, err := p.drv.EnsureInboxPartitions(t.Context(), pnow, 7)
	if err != nil {
		t.Fatalf("EnsureInboxPartitions: %v", err)
	}
	if want := []string{pname(4), pname(5), pname(6), pname(7)}; !slices.Equal(created, want) {
		t.Errorf("created %v; want %v", created, want)
	}
	if rel := p.where(future[0]); rel != pname(7) {
		t.Errorf("the row is in %s after its day's partition was created; want %s", rel, pname(7))
	}
	if n := p.present(future); n != 3 {
		t.Errorf("%d of 3 moved rows still deduplicate", n)
	}
}

func TestEnableInboxPartitioningKeepsRows(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	p := pgInbox{t, drv}
	before := append(v7s(day(-1), 5), v4Outside())
	p.insert(before, pnow.Add(-time.Hour))
	for range 2 { // the second call only checks the partitions
		if err := drv.EnableInboxPartitioning(t.Context(), &pgdriver.PartitionOptions{Now: pnow}); err != nil {
			t.Fatalf("EnableInboxPartitioning: %v", err)
		}
	}
	if ok, err := drv.InboxPartitioned(t.Context()); err != nil || !ok {
		t.Fatalf("InboxPartitioned = %v, %v", ok, err)
	}
	if n := p.present(before); n != len(before) {
		t.Errorf("%d of %d rows survived the conversion", n, len(before))
	}
	if rel := p.where(before[0]); rel != pname(-1) {
		t.Errorf("a converted row of day -1 is in %s", rel)
	}
	// The primary key still deduplicates: inserting again adds nothing.
	if got, err := drv.Executor().InboxInsert(t.Context(), &driver.InboxInsertParams{Consumer: "c", IDs: before, Now: pnow}); err != nil || len(got) != 0 {
		t.Errorf("InboxInsert of converted ids = %v, %v; want none new", got, err)
	}
}

// Replicas that all call EnableInboxPartitioning at start-up, at once, all
// succeed: the one that converts the table does, the others find it
// converted once they hold the lock, and no row is lost.
func TestEnableInboxPartitioningConcurrently(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	p := pgInbox{t, drv}
	rows := append(v7s(day(-1), 5), v4Outside())
	p.insert(rows, pnow.Add(-time.Hour))
	replicas := make([]*pgdriver.Driver, 4)
	for i := range replicas {
		replicas[i] = pgReplica(t, drv).(*pgdriver.Driver)
	}
	errs := make([]error, len(replicas))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, r := range replicas {
		wg.Go(func() {
			<-start
			errs[i] = r.EnableInboxPartitioning(t.Context(), &pgdriver.PartitionOptions{Now: pnow})
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: EnableInboxPartitioning: %v", i, err)
		}
	}
	if want := []string{"processed_event_default", pname(-3), pname(-2), pname(-1), pname(0), pname(1), pname(2), pname(3)}; !slices.Equal(p.partitions(), want) {
		t.Errorf("partitions = %v; want %v", p.partitions(), want)
	}
	if n := p.present(rows); n != len(rows) {
		t.Errorf("%d of %d rows survived the conversion", n, len(rows))
	}
}

// Partition maintenance run by several processes at once (a replica's
// EnableInboxPartitioning at start-up during a sweep, or a sweep that
// outlived its lease): none fails on a partition another one dropped, and
// each partition is reported created, or dropped, by exactly one of them.
func TestPartitionMaintenanceConcurrently(t *testing.T) {
	t.Parallel()
	p := partitioned(t)
	replicas := make([]*pgdriver.Driver, 3)
	for i := range replicas {
		replicas[i] = pgReplica(t, p.drv).(*pgdriver.Driver)
	}
	created := make([][]string, len(replicas))
	dropped := make([][]string, len(replicas))
	errs := make([]error, len(replicas))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, r := range replicas {
		wg.Go(func() {
			<-start
			if created[i], errs[i] = r.EnsureInboxPartitions(t.Context(), pnow, 6); errs[i] != nil {
				return
			}
			dropped[i], _, errs[i] = r.DropInboxPartitionsBefore(t.Context(), day(-3))
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
	all := func(lists [][]string) []string {
		var out []string
		for _, l := range lists {
			out = append(out, l...)
		}
		slices.Sort(out)
		return out
	}
	if got, want := all(created), []string{pname(4), pname(5), pname(6)}; !slices.Equal(got, want) {
		t.Errorf("reported created %v (per replica %v); want each of %v once", got, created, want)
	}
	if got, want := all(dropped), []string{pname(-6), pname(-5), pname(-4)}; !slices.Equal(got, want) {
		t.Errorf("reported dropped %v (per replica %v); want each of %v once", got, dropped, want)
	}
	if got, want := p.partitions(), []string{"processed_event_default", pname(-3), pname(-2), pname(-1), pname(0), pname(1), pname(2), pname(3), pname(4), pname(5), pname(6)}; !slices.Equal(got, want) {
		t.Errorf("partitions = %v; want %v", got, want)
	}
}

// The cleaner refuses a partition mode that does not match the table: row
// DELETEs on a partitioned table would never drop a partition, and partition
// mode on a plain table has nothing to drop.
func TestPartitionModeMismatch(t *testing.T) {
	t.Parallel()
	p := partitioned(t)
	if _, err := partitionCleaner(t, p.drv, false).RunOnce(t.Context()); !errors.Is(err, cleanup.ErrInboxPartitioning) {
		t.Errorf("DELETE mode on a partitioned table: err = %v; want ErrInboxPartitioning", err)
	}
	plain := testdb.Postgres(t)
	if _, err := partitionCleaner(t, plain, true).RunOnce(t.Context()); !errors.Is(err, cleanup.ErrInboxPartitioning) {
		t.Errorf("partition mode on a plain table: err = %v; want ErrInboxPartitioning", err)
	}
}

// Partition mode with the inbox sweep disabled: nothing would create the
// day partitions, and every insert would go to the DEFAULT partition for
// ever. New refuses it.
func TestPartitionModeSweepDisabled(t *testing.T) {
	t.Parallel()
	p := partitioned(t)
	_, err := cleanup.New(p.drv, &cleanup.Config{
		PartitionedInbox: true, Inbox: cleanup.InboxRetention{Disabled: true},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err == nil || !strings.Contains(err.Error(), "PartitionedInbox with Inbox.Disabled") {
		t.Fatalf("New(PartitionedInbox, Inbox.Disabled) = %v; want it refused", err)
	}
}

// Dropping and creating partitions while consumers insert: no insert fails.
func TestPartitionMaintenanceUnderInsertLoad(t *testing.T) {
	t.Parallel()
	p := partitioned(t)
	for i := -6; i <= -4; i++ {
		p.insert(v7s(day(i), 500), day(i))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var inserted atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				at := pnow.Add(time.Duration(w*100000+i) * time.Millisecond)
				ids := append(v7s(at, 5), v4Outside()) // today's partition and the default
				if got, err := p.drv.Executor().InboxInsert(t.Context(), &driver.InboxInsertParams{Consumer: "c", IDs: ids, Now: at}); err != nil || len(got) != len(ids) {
					t.Errorf("insert during partition maintenance: %d new, %v", len(got), err)
					return
				}
				inserted.Add(int64(len(ids)))
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	rep, err := partitionCleaner(t, p.drv, true).RunOnce(t.Context())
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if in := rep.Tables[1]; len(in.PartitionsDropped) != 3 || len(in.PartitionsCreated) != 2 {
		t.Errorf("dropped %v, created %v; want 3 and 2", in.PartitionsDropped, in.PartitionsCreated)
	}
	if inserted.Load() == 0 {
		t.Error("no inserts ran during the sweep")
	}
}

// InboxDeleteBefore on a partitioned processed_event deletes exactly the old
// rows: partitions have overlapping ctids, so deleting by ctid would also
// remove young rows that share one with an old row in another partition.
func TestInboxDeleteBeforeOnPartitionedTable(t *testing.T) {
	t.Parallel()
	p := partitioned(t)
	old, young := v7s(day(-5), 10), v7s(day(-1), 10)
	p.insert(old, day(-5))
	p.insert(young, day(-1))
	// In batches of 3, each after the last of the one before: the
	// partitions' rows in one order.
	var after driver.InboxCursor
	n := 0
	for range len(old) {
		res, err := p.drv.Executor().InboxDeleteBefore(t.Context(), &driver.InboxDeleteBeforeParams{Consumer: "", Before: day(-3), Limit: 3, After: after})
		if err != nil {
			t.Fatalf("InboxDeleteBefore: %v", err)
		}
		n += res.Deleted
		after = res.Last
		if res.Deleted < 3 {
			break
		}
	}
	if n != len(old) {
		t.Fatalf("InboxDeleteBefore in batches of 3 deleted %d; want %d", n, len(old))
	}
	if got := p.present(old); got != 0 {
		t.Errorf("%d old rows survived", got)
	}
	if got := p.present(young); got != len(young) {
		t.Errorf("%d of %d young rows survived", got, len(young))
	}
}

// A day whose rows were mostly processed late (a consumer that caught up on a
// long backlog, a new consumer group reading the topic from the start) is
// not copied to the default partition while processed_event is locked
// exclusively: every consumer's insert waited for the whole copy. The day is
// kept until its rows are older than the retention; none of them is lost.
func TestPartitionDropDoesNotCopyALateDayUnderLock(t *testing.T) {
	t.Parallel()
	p := partitioned(t)
	ctx := t.Context()
	const late = 100000
	lo := pgdriver.InboxPartitionBound(day(-4))
	// UUIDv7-like ids of day -4 (its first millisecond, random bits after),
	// processed an hour ago.
	if _, err := p.drv.Pool().Exec(ctx, `INSERT INTO processed_event (consumer_name, event_id, processed_at)
		SELECT 'c', encode(overlay(uuid_send(gen_random_uuid()) PLACING substring(uuid_send($1::uuid) FROM 1 FOR 6) FROM 1 FOR 6), 'hex')::uuid, $2
		FROM generate_series(1, $3)`, lo, pnow.Add(-time.Hour), late); err != nil {
		t.Fatal(err)
	}
	old := v7s(day(-4).Add(time.Hour), 5)
	p.insert(old, day(-4).Add(2*time.Hour))
	if rel := p.where(old[0]); rel != pname(-4) {
		t.Fatalf("a UUIDv7 of day -4 is in %s", rel)
	}

	stop := make(chan struct{})
	var worst atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			at := pnow.Add(time.Duration(i) * time.Millisecond)
			start := time.Now()
			if _, err := p.drv.Executor().InboxInsert(ctx, &driver.InboxInsertParams{Consumer: "c", IDs: v7s(at, 1), Now: at}); err != nil {
				t.Errorf("insert during the sweep: %v", err)
				return
			}
			if d := time.Since(start); d > time.Duration(worst.Load()) {
				worst.Store(int64(d))
			}
			time.Sleep(time.Millisecond)
		}
	})
	time.Sleep(20 * time.Millisecond)
	rep, err := partitionCleaner(t, p.drv, true).RunOnce(ctx)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if d := time.Duration(worst.Load()); d > time.Second {
		t.Errorf("an inbox insert waited %s during the sweep (dropped %v, rescued %d rows)", d.Round(time.Millisecond), rep.Tables[1].PartitionsDropped, rep.Tables[1].Rescued)
	}
	var n int
	if err := p.drv.Pool().QueryRow(ctx, `SELECT count(*) FROM processed_event WHERE processed_at >= $1`, pnow.Add(-2*time.Hour)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n < late {
		t.Errorf("%d of the %d late rows left; want all kept", n, late)
	}

	// Once the late rows are older than the retention, the day goes whole.
	c, err := cleanup.New(p.drv, &cleanup.Config{
		PartitionedInbox: true, Now: func() time.Time { return pnow.Add(72 * time.Hour) },
		Pause: cleanup.NoPause, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err = c.RunOnce(ctx)
	if err != nil {
		t.Fatalf("RunOnce 72h later: %v", err)
	}
	if !slices.Contains(rep.Tables[1].PartitionsDropped, pname(-4)) {
		t.Errorf("72h later, dropped %v; want %s among them", rep.Tables[1].PartitionsDropped, pname(-4))
	}
	if got := p.present(old); got != 0 {
		t.Errorf("%d old rows of day -4 left", got)
	}
}

// In partition mode each sweep creates the partitions of the next
// PartitionsAhead days only: a schedule whose sweeps are further apart
// sends the events of the days in between to the DEFAULT partition, which
// the next sweep moves under an exclusive lock and deletes row by row, the
// cost partition mode is there to avoid. New refuses it, naming the
// PartitionsAhead that fits; with it, every event between two scheduled
// sweeps lands in a day partition.
func TestPartitionScheduleCoversTheGap(t *testing.T) {
	t.Parallel()
	p := partitioned(t)
	cfg := func(schedule string, ahead int) *cleanup.Config {
		return &cleanup.Config{
			PartitionedInbox: true,
			PartitionsAhead:  ahead,
			Schedule:         schedule,
			Location:         time.UTC,
			Now:              func() time.Time { return pnow },
			Pause:            cleanup.NoPause,
			Logger:           slog.New(slog.DiscardHandler),
		}
	}
	for _, tc := range []struct {
		schedule string
		ahead    int
		wantErr  string
	}{
		{"0 3 * * 0", 0, "PartitionsAhead to at least 7"}, // weekly, 3 days ahead by default
		{"0 3 * * 0", 6, "PartitionsAhead to at least 7"},
		{"@every 96h", 3, "PartitionsAhead to at least 4"},
		{"0 3 1 * *", 3, "PartitionsAhead to at least 31"}, // monthly
		{"0 3 * * 0", 7, ""},
		{"@every 72h", 3, ""},
		{"0 3 * * *", 0, ""},
		{"0 23 * * *", 1, ""},
	} {
		_, err := cleanup.New(p.drv, cfg(tc.schedule, tc.ahead))
		if tc.wantErr == "" && err != nil {
			t.Errorf("New(Schedule %q, PartitionsAhead %d) = %v; want a cleaner", tc.schedule, tc.ahead, err)
		}
		if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("New(Schedule %q, PartitionsAhead %d) error = %v; want one containing %q", tc.schedule, tc.ahead, err, tc.wantErr)
		}
	}
	// Without partition mode there is nothing to check (partition mode
	// with the inbox sweep disabled is refused: TestPartitionModeSweepDisabled).
	off := cfg("0 3 * * 0", 0)
	off.PartitionedInbox = false
	if _, err := cleanup.New(p.drv, off); err != nil {
		t.Errorf("New(weekly, DELETE mode) = %v; want a cleaner", err)
	}

	// Weekly with 7 days ahead: the last event before the next sweep has
	// its partition.
	c, err := cleanup.New(p.drv, cfg("0 3 * * 0", 7))
	if err != nil {
		t.Fatal(err)
	}
	f := c.Next(pnow)
	g := c.Next(f)
	sweep, err := cleanup.New(p.drv, &cleanup.Config{
		PartitionedInbox: true, PartitionsAhead: 7, Schedule: "0 3 * * 0", Location: time.UTC,
		Now: func() time.Time { return f }, Pause: cleanup.NoPause, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sweep.RunOnce(t.Context()); err != nil {
		t.Fatalf("sweep at %s: %v", f, err)
	}
	last := v7At(g.Add(-time.Minute))
	p.insert([]uuid.UUID{last}, g.Add(-time.Minute))
	if got := p.where(last); got == "processed_event_default" {
		t.Errorf("an event of %s, before the next sweep at %s, landed in %s; want its day's partition", g.Add(-time.Minute), g, got)
	}
}

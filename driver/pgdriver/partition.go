package pgdriver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// Partition mode of the inbox (opt-in; see package cleanup for when to
// choose it).
//
// EnableInboxPartitioning turns processed_event into a table range-
// partitioned on event_id by day: the partition of day D (UTC) holds the ids
// from InboxPartitionBound(D) to InboxPartitionBound(D+1), which are exactly
// the UUIDv7 ids created that day (their first 48 bits are the Unix time in
// milliseconds). A DEFAULT partition takes every other id: ids of days
// without a partition, and ids that are not UUIDv7 (unless their first 48
// bits happen to fall into an existing day's range; see
// DropInboxPartitionsBefore for why that is still safe). The primary key
// (event_id, consumer_name) contains the partition key, so it stays a
// primary key, and InboxInsert's ON CONFLICT works unchanged.
//
// The cleaner then creates partitions ahead (EnsureInboxPartitions), drops
// whole expired days (DropInboxPartitionsBefore) and deletes the default
// partition's old rows in batches (DeleteInboxDefaultBefore). Driver
// implements cleanup.InboxPartitioner with these methods.
//
// InboxDeleteBefore stays correct on a partitioned processed_event (it
// deletes by primary key), but it is the slow path there: the cleaner refuses
// a partition mode that does not match the table.

// PartitionLockTimeout bounds how long a partition operation waits for a
// table lock (lock_timeout). DETACH and the creation of a partition need
// brief exclusive locks; a wait queued behind a long transaction would block
// the inserts queued behind it, so it gives up instead and the next sweep
// tries again.
const PartitionLockTimeout = 2 * time.Second

// PartitionRescueMax is the most rows processed within the retention that
// DropInboxPartitionsBefore copies out of an expired day before dropping it.
// The copy runs while processed_event is locked exclusively (DETACH
// PARTITION), so every consumer's insert waits for it; a day holding more
// such rows (a consumer that caught up on a long backlog, a new consumer
// group reading the topic from its start) is kept whole instead, and
// dropped by a later sweep once its rows are older than the retention.
const PartitionRescueMax = 1000

// PartitionOptions configure EnableInboxPartitioning. The zero value gives
// the defaults.
type PartitionOptions struct {
	// Now is the current time. Defaults to time.Now().
	Now time.Time
	// Behind is how many days before Now get a partition at conversion, so
	// the existing rows of recent days land in droppable partitions.
	// Defaults to 3 (the longest inbox retention without override).
	Behind int
	// Ahead is how many days after Now get a partition. Defaults to 3.
	Ahead int
}

// InboxPartition is one partition of a partitioned processed_event.
type InboxPartition struct {
	// Name is the partition's table name (without schema).
	Name string
	// Default is true for the DEFAULT partition; Day, From and To are then
	// zero.
	Default bool
	// Day is the UTC day whose UUIDv7 ids the partition holds.
	Day time.Time
	// From (inclusive) and To (exclusive) are the partition's bounds.
	From, To uuid.UUID
}

// InboxPartitionBound returns the smallest UUIDv7 of the millisecond t: the
// 48-bit big-endian Unix millisecond timestamp followed by zero bits. Times
// before the Unix epoch give the nil UUID; times after the 48-bit range give
// the largest 48-bit prefix.
func InboxPartitionBound(t time.Time) uuid.UUID {
	ms := t.UnixMilli()
	ms = max(0, min(ms, 1<<48-1))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(ms))
	var id uuid.UUID
	copy(id[:6], b[2:])
	return id
}

// utcDay truncates t to the start of its UTC day.
func utcDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

const partitionLayout = "20060102"

// partitionRel returns the bare table name of the partition of day.
func (d *Driver) partitionRel(day time.Time) string {
	return d.cfg.TablePrefix + "processed_event_p" + day.Format(partitionLayout)
}

// rel qualifies a bare table name with the driver's schema.
func (d *Driver) rel(bare string) string {
	if d.cfg.Schema == "" {
		return pgx.Identifier{bare}.Sanitize()
	}
	return pgx.Identifier{d.cfg.Schema, bare}.Sanitize()
}

func (d *Driver) inboxParent() string  { return d.rel(d.cfg.TablePrefix + "processed_event") }
func (d *Driver) inboxDefault() string { return d.rel(d.cfg.TablePrefix + "processed_event_default") }

// InboxPartitioned reports whether processed_event is partitioned.
func (d *Driver) InboxPartitioned(ctx context.Context) (bool, error) {
	return d.inboxPartitioned(ctx, d.pool)
}

func (d *Driver) inboxPartitioned(ctx context.Context, q dbtx) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass($1))`,
		d.inboxParent()).Scan(&ok)
	if err != nil {
		return false, mapErr("inbox partitioned", err)
	}
	return ok, nil
}

// InboxPartitions lists the partitions of processed_event: the default one
// first, then the days in order. Tables attached by hand under other names
// are left out.
func (d *Driver) InboxPartitions(ctx context.Context) ([]InboxPartition, error) {
	// The bound is NULL for a partition another process is detaching.
	rows, err := d.pool.Query(ctx, `SELECT c.relname, coalesce(pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT', false)
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = to_regclass($1)`, d.inboxParent())
	if err != nil {
		return nil, mapErr("inbox partitions", err)
	}
	type rel struct {
		name string
		def  bool
	}
	rels, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rel, error) {
		var x rel
		return x, r.Scan(&x.name, &x.def)
	})
	if err != nil {
		return nil, mapErr("inbox partitions", err)
	}
	var out []InboxPartition
	dayPrefix := d.cfg.TablePrefix + "processed_event_p"
	for _, r := range rels {
		if r.def {
			out = append(out, InboxPartition{Name: r.name, Default: true})
			continue
		}
		s, ok := strings.CutPrefix(r.name, dayPrefix)
		if !ok {
			continue
		}
		day, err := time.Parse(partitionLayout, s)
		if err != nil {
			continue
		}
		out = append(out, InboxPartition{
			Name: r.name, Day: day,
			From: InboxPartitionBound(day), To: InboxPartitionBound(day.AddDate(0, 0, 1)),
		})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Default != out[j].Default {
			return out[i].Default
		}
		return out[i].Day.Before(out[j].Day)
	})
	return out, nil
}

// partitionTx runs fn in a transaction that holds the driver's maintenance
// advisory lock (the migration lock of the schema, whether the driver names
// it or reaches it through search_path: partition changes and migrations of
// one schema never interleave), then sets lock_timeout
// PartitionLockTimeout for its table locks. The advisory lock is waited
// for as long as ctx allows: its holder is another process's maintenance
// or migration, whose end fn must see (a replica converting the table at
// start-up, replicas started with it), and nobody queues behind that wait,
// unlike a table lock's.
func (d *Driver) partitionTx(ctx context.Context, op string, fn func(tx pgx.Tx) error) error {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return mapErr(op, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	key, err := d.lockKey(ctx, tx)
	if err != nil {
		return mapErr(op, err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = 0"); err != nil { // a role's own lock_timeout too
		return mapErr(op, err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
		return mapErr(op, err)
	}
	ms := PartitionLockTimeout.Milliseconds()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", ms)); err != nil {
		return mapErr(op, err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return mapErr(op, err)
	}
	return nil
}

func uuidLiteral(id uuid.UUID) string { return "'" + id.String() + "'" }

// EnableInboxPartitioning converts processed_event into the partitioned
// table described above, in ONE transaction: the existing table is renamed,
// the partitioned table is created with the same columns, primary key and
// processed_at index, with a DEFAULT partition and daily partitions from
// opts.Behind days before opts.Now to opts.Ahead days after it; the existing
// rows are copied over and the old table is dropped. The new table (and
// the partitions created with it) keep the old table's owner, and the new
// table the privileges granted on the old one (GRANT ... ON processed_event:
// table-level grants; grants on single columns are not carried over), so
// an application role keeps its access. It is a migration-like
// step outside the numbered migrations (Migrate must have run first); on a
// table that is already partitioned it only creates missing partitions, so
// every replica may call it at start-up, at once: one converts the table,
// the others wait for it and find it converted.
//
// The copy holds an exclusive lock on processed_event: consumers wait until
// it commits. Convert an empty or small table, or do it in a maintenance
// window. opts may be nil.
func (d *Driver) EnableInboxPartitioning(ctx context.Context, opts *PartitionOptions) error {
	if p := d.cfg.TablePrefix; len(p) > pgsql.MaxPartitionedPrefix {
		return fmt.Errorf("pgdriver: inbox partitioning: TablePrefix %q is %d characters; at most %d (PostgreSQL cuts names at 63 bytes, and the partitions' names would collide)",
			p, len(p), pgsql.MaxPartitionedPrefix)
	}
	var o PartitionOptions
	if opts != nil {
		o = *opts
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.Behind == 0 {
		o.Behind = 3
	}
	if o.Ahead == 0 {
		o.Ahead = 3
	}
	if o.Behind < 0 || o.Ahead < 0 {
		return fmt.Errorf("pgdriver: enable inbox partitioning: Behind %d and Ahead %d must not be negative", o.Behind, o.Ahead)
	}
	partitioned, err := d.InboxPartitioned(ctx)
	if err != nil {
		return err
	}
	if !partitioned {
		err = d.partitionTx(ctx, "enable inbox partitioning", func(tx pgx.Tx) error {
			// Checked again under the lock: another process (a replica
			// starting at the same time) may have converted the table
			// while this one waited for it.
			var err error
			if partitioned, err = d.inboxPartitioned(ctx, tx); err != nil || partitioned {
				return err
			}
			return d.convertInbox(ctx, tx, o)
		})
		if err != nil || !partitioned {
			return err
		}
	}
	_, err = d.EnsureInboxPartitions(ctx, o.Now, o.Ahead)
	return err
}

func (d *Driver) convertInbox(ctx context.Context, tx pgx.Tx, o PartitionOptions) error {
	p := d.cfg.TablePrefix
	old := d.rel(p + "processed_event_unpartitioned")
	parent := d.inboxParent()
	// The new table gets the old one's privileges and owner: the
	// application's role, granted INSERT on processed_event, would be
	// refused every insert after the conversion.
	keep, err := d.inboxPrivileges(ctx, tx)
	if err != nil {
		return err
	}
	stmts := []string{
		// Free the names of the table, its primary key and its index.
		`ALTER TABLE ` + parent + ` RENAME TO ` + pgx.Identifier{p + "processed_event_unpartitioned"}.Sanitize(),
		`ALTER INDEX ` + d.rel(p+"processed_event_pkey") + ` RENAME TO ` + pgx.Identifier{p + "processed_event_unpartitioned_pkey"}.Sanitize(),
		`ALTER INDEX ` + d.rel(p+"processed_event_processed_at_idx") + ` RENAME TO ` + pgx.Identifier{p + "processed_event_unpartitioned_processed_at_idx"}.Sanitize(),
		`CREATE TABLE ` + parent + ` (LIKE ` + old + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS)
			PARTITION BY RANGE (event_id)`,
		`ALTER TABLE ` + parent + ` ADD CONSTRAINT ` + pgx.Identifier{p + "processed_event_pkey"}.Sanitize() + ` PRIMARY KEY (event_id, consumer_name)`,
		`CREATE INDEX ` + pgx.Identifier{p + "processed_event_processed_at_idx"}.Sanitize() + ` ON ` + parent + ` (processed_at)`,
		`CREATE TABLE ` + d.inboxDefault() + ` PARTITION OF ` + parent + ` DEFAULT`,
	}
	parts := []string{d.inboxDefault()}
	today := utcDay(o.Now)
	for i := -o.Behind; i <= o.Ahead; i++ {
		day := today.AddDate(0, 0, i)
		part := d.rel(d.partitionRel(day))
		parts = append(parts, part)
		stmts = append(stmts, `CREATE TABLE `+part+` PARTITION OF `+parent+
			` FOR VALUES FROM (`+uuidLiteral(InboxPartitionBound(day))+`) TO (`+uuidLiteral(InboxPartitionBound(day.AddDate(0, 0, 1)))+`)`)
	}
	stmts = append(stmts, `INSERT INTO `+parent+` SELECT * FROM `+old)
	stmts = append(stmts, keep.statements(parent, parts)...)
	stmts = append(stmts, `DROP TABLE `+old)
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return mapErr("enable inbox partitioning", err)
		}
	}
	return nil
}

// tablePrivileges are a table's owner and the privileges granted on it.
type tablePrivileges struct {
	owner  string // empty: the current user's, nothing to change
	grants []grant
}

// grant is one privilege granted on a table.
type grant struct {
	priv, to  string // to is a sanitized role name or PUBLIC
	grantable bool
}

// inboxPrivileges reads the owner of processed_event, when it is not the
// current user, and the privileges granted on it (table-level; grants on
// single columns are not carried over).
func (d *Driver) inboxPrivileges(ctx context.Context, tx pgx.Tx) (tablePrivileges, error) {
	const op = "enable inbox partitioning: read the privileges of processed_event"
	var tp tablePrivileges
	var owner string
	var mine bool
	if err := tx.QueryRow(ctx, `SELECT pg_get_userbyid(relowner), relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
		FROM pg_class WHERE oid = $1::regclass`, d.inboxParent()).Scan(&owner, &mine); err != nil {
		return tp, mapErr(op, err)
	}
	if !mine {
		tp.owner = owner
	}
	// The owner's own privileges come with the ownership.
	rows, err := tx.Query(ctx, `SELECT a.grantee = 0, COALESCE(pg_get_userbyid(a.grantee), ''), a.privilege_type, a.is_grantable
		FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = $1::regclass AND a.grantee <> c.relowner ORDER BY 2, 3`, d.inboxParent())
	if err != nil {
		return tp, mapErr(op, err)
	}
	for rows.Next() {
		var (
			public, grantable bool
			grantee, priv     string
		)
		if err := rows.Scan(&public, &grantee, &priv, &grantable); err != nil {
			rows.Close()
			return tp, mapErr(op, err)
		}
		to := "PUBLIC"
		if !public {
			to = pgx.Identifier{grantee}.Sanitize()
		}
		tp.grants = append(tp.grants, grant{priv: priv, to: to, grantable: grantable})
	}
	if err := rows.Err(); err != nil {
		return tp, mapErr(op, err)
	}
	return tp, nil
}

// statements returns the statements that give parent the privileges, and
// it and its partitions parts the owner.
func (tp tablePrivileges) statements(parent string, parts []string) []string {
	var out []string
	for _, g := range tp.grants {
		s := `GRANT ` + g.priv + ` ON ` + parent + ` TO ` + g.to
		if g.grantable {
			s += ` WITH GRANT OPTION`
		}
		out = append(out, s)
	}
	if tp.owner != "" {
		for _, t := range append([]string{parent}, parts...) {
			out = append(out, `ALTER TABLE `+t+` OWNER TO `+pgx.Identifier{tp.owner}.Sanitize())
		}
	}
	return out
}

// EnsureInboxPartitions implements cleanup.InboxPartitioner: it creates the
// missing partitions of the days from now's UTC day to ahead days after it,
// each in its own short transaction, and returns the names of those it
// created (not those another process created meanwhile). Rows of the new day's range that the
// default partition holds are moved into the new partition before it is
// attached (ATTACH PARTITION takes only a SHARE UPDATE EXCLUSIVE lock on
// processed_event, so inserts into other days go on; the default partition
// is locked for the move).
func (d *Driver) EnsureInboxPartitions(ctx context.Context, now time.Time, ahead int) ([]string, error) {
	parts, err := d.InboxPartitions(ctx)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, p := range parts {
		have[p.Name] = true
	}
	var created []string
	today := utcDay(now)
	for i := 0; i <= ahead; i++ {
		day := today.AddDate(0, 0, i)
		name := d.partitionRel(day)
		if have[name] {
			continue
		}
		var made bool
		if err := d.partitionTx(ctx, "create inbox partition", func(tx pgx.Tx) error {
			var err error
			made, err = d.createPartition(ctx, tx, day)
			return err
		}); err != nil {
			return created, fmt.Errorf("pgdriver: create inbox partition %s: %w", name, err)
		}
		if made {
			created = append(created, name)
		}
	}
	return created, nil
}

// createPartition creates the partition of day and reports true, or false
// when it exists already (created meanwhile by another process).
func (d *Driver) createPartition(ctx context.Context, tx pgx.Tx, day time.Time) (bool, error) {
	part := d.rel(d.partitionRel(day))
	parent, def := d.inboxParent(), d.inboxDefault()
	lo, hi := InboxPartitionBound(day), InboxPartitionBound(day.AddDate(0, 0, 1))
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, part).Scan(&exists); err != nil {
		return false, mapErr("create inbox partition", err)
	}
	if exists {
		return false, nil
	}
	stmts := []struct {
		sql  string
		args []any
	}{
		// First, so that no insert lands in the range between the move
		// and the attach.
		{`LOCK TABLE ` + def + ` IN ACCESS EXCLUSIVE MODE`, nil},
		{`CREATE TABLE ` + part + ` (LIKE ` + parent + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`, nil},
		{`WITH moved AS (DELETE FROM ` + def + ` WHERE event_id >= $1 AND event_id < $2 RETURNING *)
			INSERT INTO ` + part + ` SELECT * FROM moved`, []any{lo, hi}},
		{`ALTER TABLE ` + parent + ` ATTACH PARTITION ` + part +
			` FOR VALUES FROM (` + uuidLiteral(lo) + `) TO (` + uuidLiteral(hi) + `)`, nil},
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s.sql, s.args...); err != nil {
			return false, mapErr("create inbox partition", err)
		}
	}
	return true, nil
}

// DropInboxPartitionsBefore implements cleanup.InboxPartitioner: it drops
// every daily partition whose whole day ended at or before before, oldest
// first, each in its own short transaction: DETACH PARTITION (a brief
// exclusive lock on processed_event, bounded by PartitionLockTimeout), then
// the rows of the detached day processed at or after before are inserted
// again (they now go to the default partition), then DROP TABLE. A day with
// more than PartitionRescueMax such rows is kept whole (the copy would hold
// the exclusive lock, and stall every consumer, for as long as it takes);
// a later call drops it once they are older than before.
//
// The re-insert keeps the guarantee of DELETE mode: no row processed less
// than the retention ago is removed. It matters for events processed long
// after they were created (consumer lag), and for ids that are not UUIDv7
// but whose first 48 bits fall into a day's range. It returns the
// partitions it dropped (not those another process dropped meanwhile) and
// how many rows were moved.
func (d *Driver) DropInboxPartitionsBefore(ctx context.Context, before time.Time) ([]string, int, error) {
	parts, err := d.InboxPartitions(ctx)
	if err != nil {
		return nil, 0, err
	}
	var dropped []string
	rescued := 0
	for _, p := range parts {
		if p.Default || p.Day.AddDate(0, 0, 1).After(before) {
			continue
		}
		var n int
		var gone bool
		err := d.partitionTx(ctx, "drop inbox partition", func(tx pgx.Tx) error {
			var err error
			n, gone, err = d.dropPartition(ctx, tx, p.Name, before)
			return err
		})
		if errors.Is(err, errKeepPartition) {
			continue
		}
		if err != nil {
			return dropped, rescued, fmt.Errorf("pgdriver: drop inbox partition %s: %w", p.Name, err)
		}
		if !gone {
			dropped = append(dropped, p.Name)
			rescued += n
		}
	}
	return dropped, rescued, nil
}

// errKeepPartition is dropPartition's answer for a day kept whole: it holds
// more than PartitionRescueMax rows processed at or after before.
var errKeepPartition = errors.New("pgdriver: inbox partition kept: too many rows within the retention")

// dropPartition drops the partition name and returns how many rows it
// moved, or reports gone when it is no longer a partition of processed_event
// (dropped meanwhile by another process).
func (d *Driver) dropPartition(ctx context.Context, tx pgx.Tx, name string, before time.Time) (moved int, gone bool, err error) {
	part, parent := d.rel(name), d.inboxParent()
	var attached bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits
		WHERE inhrelid = to_regclass($1) AND inhparent = to_regclass($2))`, part, parent).Scan(&attached); err != nil {
		return 0, false, mapErr("drop inbox partition", err)
	}
	if !attached {
		return 0, true, nil
	}
	// Counted before the exclusive lock, through the processed_at index: a
	// day with many young rows is kept rather than copied under the lock.
	var young int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+part+` WHERE processed_at >= $1 LIMIT $2) y`,
		before, PartitionRescueMax+1).Scan(&young); err != nil {
		return 0, false, mapErr("count young rows of inbox partition", err)
	}
	if young > PartitionRescueMax {
		return 0, false, errKeepPartition
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+part); err != nil {
		return 0, false, mapErr("detach inbox partition", err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO `+parent+` SELECT * FROM `+part+` WHERE processed_at >= $1
		ON CONFLICT DO NOTHING`, before)
	if err != nil {
		return 0, false, mapErr("keep young rows of inbox partition", err)
	}
	if _, err := tx.Exec(ctx, `DROP TABLE `+part); err != nil {
		return 0, false, mapErr("drop inbox partition", err)
	}
	return int(tag.RowsAffected()), false, nil
}

// DeleteInboxDefaultBefore implements cleanup.InboxPartitioner: it deletes
// at most p.Limit rows of the default partition of p.Consumer ("" for
// every consumer) processed before p.Before, oldest first in
// (processed_at, consumer_name, event_id) order from p.After on, skipping
// rows a concurrent transaction holds, and returns how many it deleted and
// the last one's key, as InboxDeleteBefore does (see driver.DeleteResult).
// The default partition is a plain table, so deleting by ctid is exact
// there.
func (d *Driver) DeleteInboxDefaultBefore(ctx context.Context, p *driver.InboxDeleteBeforeParams) (driver.DeleteResult[driver.InboxCursor], error) {
	if p.Limit <= 0 {
		return driver.DeleteResult[driver.InboxCursor]{Last: p.After}, fmt.Errorf("pgdriver: inbox default delete: limit %d must be positive", p.Limit)
	}
	sql := pgsql.InboxDeleteDefaultSQL(d.inboxDefault()).Pick(!p.After.IsZero())
	res, err := inboxDelete(ctx, d.pool, sql, p)
	return res, mapErr("inbox default delete", err)
}

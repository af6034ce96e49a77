package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/driver/internal/stores"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// Config configures the PostgreSQL driver. The zero value is valid.
type Config struct {
	// Schema holds idem's tables. Defaults to "" (the connection's
	// search_path, usually public). Migrate creates it when missing.
	// Every replica sharing the tables must use the same TablePrefix. The
	// relays' lane locks and the outbox's NOTIFY channel derive from the
	// schema: with Schema "", from the one the outbox table is found in
	// through search_path (read once per driver, so every connection of
	// the pool must find the same), so a replica configured with "public"
	// and one configured with "" on search_path public exclude each other,
	// and services in different schemas of one database do not.
	Schema string
	// TablePrefix is prepended to every table, index and constraint name.
	// Defaults to "" (the conventional table names of docs/rules.md:
	// idempotency_record, processed_event, ...). At most 40 characters
	// (31 for pgdriver's inbox partitioning).
	TablePrefix string

	// OutboxDeletePublished makes OutboxMarkPublished delete the events it
	// marks (their outbox and pending rows) instead of recording their
	// publication time in outbox_published. Nothing is then kept for
	// audits or for outbox.Redrive, which fails: republishing after a
	// broker lost acknowledged events is up to you. It is not faster:
	// since migration 008 marking is a narrow DELETE and a narrow INSERT,
	// and deleting the wide event row costs more (kafkabench, 1,000 keys,
	// side by side: 39,000-48,000 events/s deleting against 55,000-58,000
	// marking). Use it only when published events must not be kept.
	// Defaults to false: published events are kept until the cleaner
	// removes them (see package cleanup).
	OutboxDeletePublished bool

	// TransactionPooling says that the pool reaches PostgreSQL through a
	// pooler in transaction mode (PgBouncer's pool_mode = transaction, and
	// others that hand a client a server connection per transaction), where
	// nothing set in a session outlives a transaction. The driver then
	// keeps every lock inside a transaction (see "Behind a connection
	// pooler" in the package documentation). It detects such poolers by
	// itself: a connection whose process ID (the one the server, or the
	// pooler, gave at connection start) is not the process ID of the server
	// session that runs its statements goes through a pooler. Set it only
	// for a pooler that passes the server's process ID on. Defaults to
	// false.
	TransactionPooling bool

	// NoOutboxNotify makes OutboxInsert enqueue without pg_notify, and
	// ListenOutbox return driver.ErrOutboxNotifyOff (relays then poll
	// every RelayConfig.PollInterval, 1s by default). PostgreSQL commits
	// the transactions that notified one at a time, server-wide: a
	// notifying transaction holds a lock of its own from the start of its
	// COMMIT until the COMMIT's WAL flush is done, so notifying writers
	// get no group commit and queue behind each other's disk flush: their
	// commits per second stop growing with the writers (bench/kafkabench
	// -scenarios enqueue, one event per transaction, 2 cores: 1,900-2,300
	// with the notify for 1, 8 or 32 writers, 3,400-3,500 without it for
	// 8 and 32; on a loaded machine, 430-510 against 1,900-2,000). Set it
	// when many concurrent transactions enqueue (hundreds per second or
	// more, or a slow disk), and accept up to PollInterval of publish
	// latency (or set a shorter PollInterval). Defaults to false: every insert
	// that enqueues a new event notifies, and relays publish within
	// milliseconds. Every driver value on the database should agree:
	// one that notifies still wakes the relays that listen.
	NoOutboxNotify bool

	// ListenConnConfig is the connection ListenOutbox LISTENs on. Defaults
	// to nil: a copy of the pool's connection config. Behind a pooler in
	// transaction mode a notification reaches a client only while it runs
	// a transaction, so ListenOutbox refuses the pool's config there
	// (errors.ErrUnsupported: the relay polls): give it a direct connection
	// to PostgreSQL (or the pooler's address in session mode).
	ListenConnConfig *pgx.ConnConfig

	// ListenBeforeConnect, if set, is called before each connection of
	// ListenOutbox's listener (its first and every reconnection) with a
	// copy of the config it is about to connect with, ListenConnConfig's
	// or the pool's (after the pool's BeforeConnect then), which it may
	// change: what must be fresh at each connection, as the pool's
	// BeforeConnect does for the pool's, when ListenConnConfig is set (a
	// password read from a rotated secret, an IAM token, the role of new
	// dynamic credentials). Without it a ListenConnConfig is used as
	// given: once its credentials are revoked, every reconnection is
	// refused and the relay falls back to polling. An error fails that
	// attempt (reported, retried).
	ListenBeforeConnect func(ctx context.Context, cfg *pgx.ConnConfig) error
}

func (c *Config) validate() error {
	return pgsql.ValidateConfig("pgdriver", c.Schema, c.TablePrefix)
}

// Driver is the PostgreSQL implementation of driver.Driver[pgx.Tx].
//
// Besides the methods listed, it has the per-table stores of driver.Driver:
// Records, Inbox, Outbox, Sagas and Locks return Executor(); RecordsTx,
// InboxTx, OutboxTx and SagasTx return UnwrapExecutor(tx).
type Driver struct {
	tableStores // Records, Inbox, Outbox, Sagas, Locks and their ...Tx forms
	pool        *pgxpool.Pool
	cfg         Config
	table       string // qualified prefix for table names: "schema".prefix
	name        string // bare prefix for index and constraint names

	names *pgsql.Names // names, expansion of the shared SQL, lock keys
	iso   pgsql.IsolationCheck
	// read chooses the claims' read statement (see pgsql.ReadBound).
	read pgsql.ReadBound
	// pooled: the pool goes through a pooler in transaction mode
	// (Config.TransactionPooling, or detected): no session-level lock.
	pooled atomic.Bool
	// askReadOnly makes the relay's claim ask whether its session is
	// read-only even when the server reports it (the tests' way to run
	// the path of servers before PostgreSQL 14 on a newer one).
	askReadOnly bool
}

// tableStores gives the per-table stores over Executor and UnwrapExecutor.
type tableStores = stores.Of[pgx.Tx]

var _ driver.Driver[pgx.Tx] = (*Driver)(nil)

// New returns a driver on pool. cfg may be nil.
func New(pool *pgxpool.Pool, cfg *Config) (*Driver, error) {
	if pool == nil {
		return nil, errors.New("pgdriver: nil pool")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	names := pgsql.NewNames(c.Schema, c.TablePrefix)
	d := &Driver{pool: pool, cfg: c, table: names.Table, name: names.Name, names: names}
	d.pooled.Store(c.TransactionPooling)
	d.tableStores = stores.New[pgx.Tx](d)
	return d, nil
}

// Pool returns the pool the driver was built on.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// Name implements driver.Driver.
func (d *Driver) Name() string { return "postgres" }

// Caps implements driver.Driver.
func (d *Driver) Caps() driver.Caps { return driver.Caps{ConcurrentWriters: true} }

// Executor implements driver.Driver.
func (d *Driver) Executor() driver.Executor { return &executor{d: d, db: d.pool} }

// UnwrapExecutor implements driver.Driver.
func (d *Driver) UnwrapExecutor(tx pgx.Tx) driver.Executor {
	return &executor{d: d, db: tx, inTx: true}
}

// Begin implements driver.Driver.
func (d *Driver) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgdriver: begin: %w", err)
	}
	return tx, nil
}

// Commit implements driver.Driver. A COMMIT that PostgreSQL answered with
// ROLLBACK (a statement of the transaction failed and its error was
// ignored: pgx.ErrTxCommitRollback) returns an error wrapping both
// driver.ErrTxAborted and pgx.ErrTxCommitRollback: nothing was committed.
// So does a deferred constraint that failed at COMMIT (SQLSTATE class 23),
// wrapping the constraint's *pgconn.PgError.
func (d *Driver) Commit(ctx context.Context, tx pgx.Tx) error {
	commit := tx.Commit
	if ct, ok := tx.(*claimTx); ok { // BeginClaim's refuses its own Commit
		commit = ct.commit
	}
	if err := commit(ctx); err != nil {
		// ROLLBACK for COMMIT (a failed statement aborted the
		// transaction), or a deferred constraint that failed at COMMIT:
		// the database refused it, nothing was committed.
		if errors.Is(err, pgx.ErrTxCommitRollback) || pgsql.IsConstraintClass(err) {
			return fmt.Errorf("pgdriver: commit: %w: %w", driver.ErrTxAborted, err)
		}
		if pgsql.Refused(err) { // 40001 under SERIALIZABLE, a full disk: rolled back
			return fmt.Errorf("pgdriver: commit: %w: %w", driver.ErrNotCommitted, err)
		}
		return fmt.Errorf("pgdriver: commit: %w", err)
	}
	return nil
}

// Rollback implements driver.Driver. A transaction whose session is over
// (its connection closed, or ended by the server: pg_terminate_backend, a
// restart) is not an error either: PostgreSQL rolled it back.
func (d *Driver) Rollback(ctx context.Context, tx pgx.Tx) error {
	rollback := tx.Rollback
	if ct, ok := tx.(*claimTx); ok { // BeginClaim's refuses its own Rollback
		rollback = ct.rollback
	}
	if err := rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) && !pgsql.SessionEnded(err) {
		return fmt.Errorf("pgdriver: rollback: %w", err)
	}
	return nil
}

var _ driver.EndedRollbacker[pgx.Tx] = (*Driver)(nil)

// RollbackEnded implements driver.EndedRollbacker: Rollback, and an error
// wrapping driver.ErrTxDone when tx had already been committed or rolled
// back (pgx.ErrTxClosed); nil, as Rollback, when its session is over. A
// transaction of BeginClaim never is: it refuses
// the Commit and Rollback of the code run in it.
func (d *Driver) RollbackEnded(ctx context.Context, tx pgx.Tx) error {
	rollback := tx.Rollback
	if ct, ok := tx.(*claimTx); ok {
		rollback = ct.rollback
	}
	if err := rollback(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxClosed) {
			return fmt.Errorf("pgdriver: rollback: %w: %w", driver.ErrTxDone, err)
		}
		if pgsql.SessionEnded(err) { // as Rollback
			return nil
		}
		return fmt.Errorf("pgdriver: rollback: %w", err)
	}
	return nil
}

// Table returns the qualified name of one of idem's tables, for example
// Table("idempotency_record") -> "idem".idempotency_record.
func (d *Driver) Table(name string) string { return d.table + name }

// expand replaces {{table}} and {{name}} in an SQL template. Templates are
// constants, so each is expanded once and cached (the statements are on the
// hot path of every request).
func (d *Driver) expand(sql string) string { return d.names.Expand(sql) }

// DatabaseNow implements driver.Clock: PostgreSQL's clock_timestamp().
func (d *Driver) DatabaseNow(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := d.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		return time.Time{}, mapErr("database clock", err)
	}
	return now, nil
}

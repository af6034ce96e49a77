package pgsqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver/internal/stores"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// Config configures the driver. The zero value is valid. It is pgdriver's
// Config: the same values give the same tables, so both backends can share
// one database.
type Config struct {
	// Schema holds idem's tables. Defaults to "" (the connection's
	// search_path, usually public). Migrate creates it when missing.
	// The lane locks and the NOTIFY channel derive from the schema, found
	// through search_path when "" (see pgdriver.Config.Schema).
	Schema string
	// TablePrefix is prepended to every table, index and constraint name.
	// Defaults to "" (the conventional table names of docs/rules.md:
	// idempotency_record, processed_event, ...). At most 40 characters
	// (31 for pgdriver's inbox partitioning).
	TablePrefix string

	// OutboxDeletePublished makes OutboxMarkPublished delete the events it
	// marks instead of recording their publication time (see
	// pgdriver.Config: nothing is kept for audits or outbox.Redrive, which
	// then fails, and it is not faster). Defaults to false.
	OutboxDeletePublished bool

	// NoOutboxNotify makes OutboxInsert enqueue without pg_notify, and
	// ListenOutbox return driver.ErrOutboxNotifyOff: relays poll every
	// RelayConfig.PollInterval. PostgreSQL commits notifying transactions
	// one at a time, server-wide; see pgdriver.Config.NoOutboxNotify for
	// the cost and when to set it. Defaults to false (every enqueue of a
	// new event notifies).
	NoOutboxNotify bool

	// ListenConnConfig is the connection ListenOutbox LISTENs on. Defaults
	// to nil: the settings of a connection of the *sql.DB. Behind a pooler
	// in transaction mode (PgBouncer's pool_mode = transaction) a
	// notification reaches a client only while it runs a transaction, so
	// ListenOutbox refuses the *sql.DB's settings there
	// (errors.ErrUnsupported: the relay polls): give it a direct connection
	// to PostgreSQL. See "Behind a connection pooler" in package pgdriver.
	// When the *sql.DB's connections get their password when they connect
	// (stdlib.OptionBeforeConnect: an IAM token, a rotated secret), set
	// ListenBeforeConnect too: the default copies the settings of one of
	// its connections, password included, which may have expired or been
	// revoked by the time the listener reconnects, and a ListenConnConfig
	// alone is used as given.
	ListenConnConfig *pgx.ConnConfig

	// ListenBeforeConnect, if set, is called before each connection of
	// ListenOutbox's listener (its first and every reconnection) with a
	// copy of the config it is about to connect with (ListenConnConfig's
	// or the default), which it may change: what must be fresh at each
	// connection (a password read from a rotated secret, an IAM token,
	// the role of new dynamic credentials). Without it, once those
	// credentials are revoked every reconnection is refused and the relay
	// falls back to polling. An error fails that attempt (reported,
	// retried).
	ListenBeforeConnect func(ctx context.Context, cfg *pgx.ConnConfig) error
}

// Driver is the PostgreSQL implementation of driver.Driver[*sql.Tx].
//
// Besides the methods listed, it has the per-table stores of driver.Driver:
// Records, Inbox, Outbox, Sagas and Locks return Executor(); RecordsTx,
// InboxTx, OutboxTx and SagasTx return UnwrapExecutor(tx).
type Driver struct {
	tableStores // Records, Inbox, Outbox, Sagas, Locks and their ...Tx forms
	db          *sql.DB
	cfg         Config
	names       *pgsql.Names
	iso         pgsql.IsolationCheck
	// read chooses the claims' read statement (see pgsql.ReadBound).
	read pgsql.ReadBound
	txs  txContexts // the contexts of Begin's transactions (see txctx.go)
}

// tableStores gives the per-table stores over Executor and UnwrapExecutor.
type tableStores = stores.Of[*sql.Tx]

var _ driver.Driver[*sql.Tx] = (*Driver)(nil)

// New returns a driver on db, a PostgreSQL database opened with any
// database/sql driver (the pgx stdlib driver "pgx" is the tested one).
// cfg may be nil.
func New(db *sql.DB, cfg *Config) (*Driver, error) {
	if db == nil {
		return nil, errors.New("pgsqldriver: nil db")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := pgsql.ValidateConfig("pgsqldriver", c.Schema, c.TablePrefix); err != nil {
		return nil, err
	}
	d := &Driver{db: db, cfg: c, names: pgsql.NewNames(c.Schema, c.TablePrefix)}
	d.tableStores = stores.New[*sql.Tx](d)
	return d, nil
}

// DB returns the database the driver was built on.
func (d *Driver) DB() *sql.DB { return d.db }

// Name implements driver.Driver.
func (d *Driver) Name() string { return "postgres" }

// Caps implements driver.Driver.
func (d *Driver) Caps() driver.Caps { return driver.Caps{ConcurrentWriters: true} }

// Executor implements driver.Driver.
func (d *Driver) Executor() driver.Executor { return &executor{d: d, db: d.db} }

// UnwrapExecutor implements driver.Driver.
func (d *Driver) UnwrapExecutor(tx *sql.Tx) driver.Executor {
	return &executor{d: d, db: tx, inTx: true}
}

// Begin implements driver.Driver. As with database/sql's BeginTx, the
// transaction is rolled back when ctx ends before Commit or Rollback; its
// COMMIT and ROLLBACK are bounded by the ctx of Commit and Rollback (not
// by ctx, as a *sql.Tx's own Commit and Rollback are).
func (d *Driver) Begin(ctx context.Context) (*sql.Tx, error) {
	tx, err := d.begin(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("pgsqldriver: begin: %w", err)
	}
	return tx, nil
}

// Commit implements driver.Driver. A COMMIT that PostgreSQL answered with
// ROLLBACK (a statement of the transaction failed and its error was
// ignored; the pgx stdlib driver returns pgx.ErrTxCommitRollback) returns
// an error wrapping both driver.ErrTxAborted and the driver's error:
// nothing was committed. So does a deferred constraint that failed at
// COMMIT (SQLSTATE class 23), wrapping the driver's error. The COMMIT is
// given up when ctx ends (its outcome unknown; the connection is closed),
// as pgdriver's.
func (d *Driver) Commit(ctx context.Context, tx *sql.Tx) error {
	done, ended := d.endOn(ctx, tx)
	defer done()
	if err := tx.Commit(); err != nil {
		err = callerErr(err, ended, ctx)
		// ROLLBACK for COMMIT (a failed statement aborted the
		// transaction), or a deferred constraint that failed at COMMIT:
		// the database refused it, nothing was committed.
		if errors.Is(err, pgx.ErrTxCommitRollback) || pgsql.IsConstraintClass(err) {
			return fmt.Errorf("pgsqldriver: commit: %w: %w", driver.ErrTxAborted, err)
		}
		if pgsql.Refused(err) { // 40001 under SERIALIZABLE, a full disk: rolled back
			return fmt.Errorf("pgsqldriver: commit: %w: %w", driver.ErrNotCommitted, err)
		}
		return fmt.Errorf("pgsqldriver: commit: %w", err)
	}
	return nil
}

// Rollback implements driver.Driver. The ROLLBACK is given up when ctx
// ends (the connection is closed). A transaction whose session is over (its
// connection closed, or ended by the server: pg_terminate_backend, a
// restart) is not an error: PostgreSQL rolled it back.
func (d *Driver) Rollback(ctx context.Context, tx *sql.Tx) error {
	done, ended := d.endOn(ctx, tx)
	defer done()
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) && !pgsql.SessionEnded(err) {
		return fmt.Errorf("pgsqldriver: rollback: %w", callerErr(err, ended, ctx))
	}
	return nil
}

var _ driver.EndedRollbacker[*sql.Tx] = (*Driver)(nil)

// RollbackEnded implements driver.EndedRollbacker: Rollback, and an error
// wrapping driver.ErrTxDone when tx had already been committed or rolled
// back (a COMMIT of the code run in it committed: there is no guard here);
// nil, as Rollback, when its session is over.
func (d *Driver) RollbackEnded(ctx context.Context, tx *sql.Tx) error {
	done, ended := d.endOn(ctx, tx)
	defer done()
	if err := tx.Rollback(); err != nil {
		if errors.Is(err, sql.ErrTxDone) {
			return fmt.Errorf("pgsqldriver: rollback: %w: %w", driver.ErrTxDone, err)
		}
		if pgsql.SessionEnded(err) { // as Rollback
			return nil
		}
		return fmt.Errorf("pgsqldriver: rollback: %w", callerErr(err, ended, ctx))
	}
	return nil
}

// Table returns the qualified name of one of idem's tables, for example
// Table("idempotency_record") -> "idem".idempotency_record.
func (d *Driver) Table(name string) string { return d.names.Table + name }

// OutboxChannel is the channel on which OutboxInsert notifies new outbox
// rows (pg_notify in the inserting statement), the same as pgdriver's: a
// pgdriver relay listening on the same database is woken by this driver's
// enqueues, and ListenOutbox listens on it. Without Config.Schema it is
// named after the schema the tables are found in through search_path, as
// pgdriver's.
func (d *Driver) OutboxChannel() string { return d.names.OutboxKnown().OutboxChannel() }

// notifyChannel is the channel OutboxInsert notifies: n's, or "" (no
// notify) with Config.NoOutboxNotify.
func (d *Driver) notifyChannel(n *pgsql.Names) string {
	if d.cfg.NoOutboxNotify {
		return ""
	}
	return n.OutboxChannel()
}

// outboxNames returns the names of the outbox's channel and lane locks (see
// pgsql.Names.Outbox), reading the outbox table's schema through db if needed.
func (d *Driver) outboxNames(ctx context.Context, db interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}) (*pgsql.Names, error) {
	n, err := d.names.Outbox(ctx, func(ctx context.Context) (string, error) {
		var s string
		return s, db.QueryRowContext(ctx, pgsql.OutboxSchemaSQL, d.names.OutboxTableName()).Scan(&s)
	})
	if err != nil {
		return nil, mapErr("outbox: schema", err)
	}
	return n, nil
}

func (d *Driver) expand(sql string) string { return d.names.Expand(sql) }

// DatabaseNow implements driver.Clock: PostgreSQL's clock_timestamp().
func (d *Driver) DatabaseNow(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := d.db.QueryRowContext(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		return time.Time{}, mapErr("database clock", err)
	}
	return now, nil
}

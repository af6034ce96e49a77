package sqlitedriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/driver/internal/stores"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/idemkit/idem/driver"
)

// Config configures the SQLite driver. The zero value is valid.
type Config struct {
	// TablePrefix is prepended to every table and index name. Defaults to
	// "" (the conventional table names of docs/rules.md).
	TablePrefix string
	// BusyTimeout is how long a statement waits for another process that
	// holds the write lock. Defaults to 10s; 1ms to about 596h. Used by
	// Open only.
	BusyTimeout time.Duration
}

// walSizeLimit is the journal_size_limit of the connections of Open (and
// of DSN): the size, in bytes, the -wal file is cut back to when SQLite
// starts the log over after a checkpoint. Under steady load the log stays
// near the autocheckpoint's 1000 pages (about 4 MiB) anyway; a reader that
// holds a snapshot for long (a backup, a report, a second process) keeps
// it from being started over, and it grows with every commit meanwhile.
// Without a limit it would keep that size on disk for as long as the
// database is open.
const walSizeLimit = 64 << 20

var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// Driver is the SQLite implementation of driver.Driver[*sql.Tx].
//
// Besides the methods listed, it has the per-table stores of driver.Driver:
// Records, Inbox, Outbox, Sagas and Locks return Executor(); RecordsTx,
// InboxTx, OutboxTx and SagasTx return UnwrapExecutor(tx).
type Driver struct {
	tableStores // Records, Inbox, Outbox, Sagas, Locks and their ...Tx forms
	db          *sql.DB
	cfg         Config
	owned       bool
	prefix      string
	stmts       *stmtCache
	// immediate: Validate saw a transaction of db hold the write lock
	// from its BEGIN (see checkImmediate).
	immediate atomic.Bool
}

// tableStores gives the per-table stores over Executor and UnwrapExecutor.
type tableStores = stores.Of[*sql.Tx]

var _ driver.Driver[*sql.Tx] = (*Driver)(nil)

// DSN returns the modernc.org/sqlite data source name Open uses for path.
// Its idem_txguard parameter (ignored by SQLite) installs the transaction
// guard of the package documentation on the connections opened with it.
func DSN(path string, busyTimeout time.Duration) string {
	if busyTimeout <= 0 {
		busyTimeout = 10 * time.Second
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", fmt.Sprintf("journal_size_limit(%d)", walSizeLimit))
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	q.Set(txGuardParam, "1") // see txguard.go
	return fileURI(path) + "?" + q.Encode()
}

// fileURI returns the file: URI of path, without parameters.
func fileURI(path string) string {
	// Escape what a file: URI would otherwise cut or decode.
	return "file:" + strings.NewReplacer("%", "%25", "#", "%23", "?", "%3F").Replace(path)
}

// Open opens (creating if needed) the SQLite database file at path with the
// settings described in the package documentation. Close closes it.
func Open(path string, cfg *Config) (*Driver, error) {
	if path == "" {
		return nil, fmt.Errorf("sqlitedriver: bad database path %q", path)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if b := c.BusyTimeout; b < 0 || (b > 0 && b < time.Millisecond) || b > math.MaxInt32*time.Millisecond {
		return nil, fmt.Errorf("sqlitedriver: BusyTimeout %s must be 1ms..%s (0 for the 10s default)", b, math.MaxInt32*time.Millisecond)
	}
	if err := checkPath(path); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", DSN(path, c.BusyTimeout))
	if err != nil {
		return nil, fmt.Errorf("sqlitedriver: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	if err := db.PingContext(context.Background()); err != nil {
		_ = db.Close()
		return nil, explainOpen(path, err)
	}
	d, err := New(db, &c)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	d.owned = true
	d.immediate.Store(true) // DSN sets _txlock=immediate
	return d, nil
}

// New returns a driver on an existing *sql.DB opened with the "sqlite"
// driver. The caller is responsible for the settings Open would apply (see
// DSN and the package documentation): Validate refuses a database without
// the three that matter most (one connection, a busy timeout, transactions
// begun IMMEDIATE: with DEFERRED ones BeginClaim locks nothing, and two
// processes both run one key's command); open it with DSN (which also sets
// WAL and synchronous=FULL). cfg
// may be nil. The transaction guard of the package documentation is on only
// if db was opened with DSN.
func New(db *sql.DB, cfg *Config) (*Driver, error) {
	if db == nil {
		return nil, errors.New("sqlitedriver: nil db")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.TablePrefix != "" && !identRe.MatchString(c.TablePrefix) {
		return nil, fmt.Errorf("sqlitedriver: TablePrefix %q must match %s", c.TablePrefix, identRe)
	}
	d := &Driver{db: db, cfg: c, prefix: c.TablePrefix, stmts: newStmtCache(db)}
	d.tableStores = stores.New[*sql.Tx](d)
	return d, nil
}

// DB returns the database handle.
func (d *Driver) DB() *sql.DB { return d.db }

// Close closes the driver's prepared statements, and the database if Open
// opened it.
func (d *Driver) Close() error {
	d.stmts.close()
	if d.owned {
		return d.db.Close()
	}
	return nil
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return "sqlite" }

// Caps implements driver.Driver.
func (d *Driver) Caps() driver.Caps { return driver.Caps{ConcurrentWriters: false} }

// Executor implements driver.Driver.
func (d *Driver) Executor() driver.Executor {
	return &executor{d: d, db: d.onDB()}
}

// UnwrapExecutor implements driver.Driver. The executor of a nil tx runs
// nothing: each of its statements fails (it never runs them outside a
// transaction, apart from the caller's writes).
func (d *Driver) UnwrapExecutor(tx *sql.Tx) driver.Executor {
	return &executor{d: d, db: d.inTx(tx)}
}

// Begin implements driver.Driver. It arms the transaction guard of the
// package documentation on the transaction's connection.
func (d *Driver) Begin(ctx context.Context) (*sql.Tx, error) {
	return d.begin(ctx, nil, nil)
}

// begin begins a transaction and arms the transaction guard (see
// txguard.go; a no-op on a connection not opened with DSN), with mark, the
// claim mark of a transaction of BeginClaim, when not nil: the arming
// statement is one either way.
func (d *Driver) begin(ctx context.Context, mark *claimMark, began func()) (*sql.Tx, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, mapErr("begin", err)
	}
	if began != nil {
		began()
	}
	arm := txGuardArm
	if mark != nil {
		arm = markClaim(tx, mark)
	}
	if _, err := tx.ExecContext(ctx, arm); err != nil {
		_ = d.Rollback(ctx, tx)
		return nil, mapErr("begin", err)
	}
	return tx, nil
}

// Commit implements driver.Driver. A transaction of BeginClaim commits
// only with CommitComplete on the connections of Open (and DSN): Commit
// rolls it back and returns an error wrapping driver.ErrTxAborted.
func (d *Driver) Commit(_ context.Context, tx *sql.Tx) error {
	// BeginClaim's; the guard holds the mark since the transaction began.
	defer takeClaim(tx).ended()
	if err := tx.Commit(); err != nil {
		if noTxActive(err) {
			return fmt.Errorf("sqlitedriver: commit: %w: %w", errTxRolledBack, err)
		}
		if isTxRolledBack(err) {
			return fmt.Errorf("sqlitedriver: commit: %w: %w", errClaimCommit, err)
		}
		return fmt.Errorf("sqlitedriver: commit: %w", err)
	}
	return nil
}

// Rollback implements driver.Driver.
func (d *Driver) Rollback(_ context.Context, tx *sql.Tx) error {
	defer takeClaim(tx).ended() // BeginClaim's
	// "No transaction is active": SQLite had rolled it back already.
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) && !noTxActive(err) {
		return fmt.Errorf("sqlitedriver: rollback: %w", err)
	}
	return nil
}

var _ driver.EndedRollbacker[*sql.Tx] = (*Driver)(nil)

// RollbackEnded implements driver.EndedRollbacker: Rollback, and an error
// wrapping driver.ErrTxDone when tx had already been committed or rolled
// back. For a transaction of BeginClaim on the connections of Open (and
// DSN) it also wraps driver.ErrTxAborted: the transaction guard let
// nothing of it commit without its record.
func (d *Driver) RollbackEnded(_ context.Context, tx *sql.Tx) error {
	mark := takeClaim(tx)
	defer mark.ended()
	err := tx.Rollback()
	switch {
	case errors.Is(err, sql.ErrTxDone):
		if mark != nil && mark.guarded.Load() {
			return errClaimEnded("rollback", mark, err)
		}
		return fmt.Errorf("sqlitedriver: rollback: %w: %w", driver.ErrTxDone, err)
	case err != nil && !noTxActive(err):
		return fmt.Errorf("sqlitedriver: rollback: %w", err)
	}
	return nil
}

// Table returns the name of one of idem's tables with the prefix applied.
func (d *Driver) Table(name string) string { return d.prefix + name }

func (d *Driver) expand(sql string) string {
	return strings.ReplaceAll(sql, "{{table}}", d.prefix)
}

// micros converts a time to the stored representation.
func micros(t time.Time) int64 { return t.UnixMicro() }

// fromMicros converts a stored time back.
func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

// DatabaseNow implements driver.Clock. SQLite runs in the process: the
// database's clock is the host's.
func (d *Driver) DatabaseNow(context.Context) (time.Time, error) { return time.Now(), nil }

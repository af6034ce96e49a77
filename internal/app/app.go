package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/apijson"
	"github.com/idemkit/idem/internal/dberr"
	"github.com/idemkit/idem/internal/orders"
	ordpg "github.com/idemkit/idem/internal/orders/pgstore"
	ordsqlite "github.com/idemkit/idem/internal/orders/sqlitestore"
	"github.com/idemkit/idem/internal/payments"
	"github.com/idemkit/idem/internal/payments/pgstore"
	"github.com/idemkit/idem/internal/payments/sqlitestore"
	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/outbox"
)

// App is a configured idemd: an open, migrated database, its HTTP
// handler, and the order pipeline's relay and consumer.
type App struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	// handler serves every route; with an admin listener (ServeWithAdmin)
	// apiHandler serves the other listener (every route but /metrics)
	// and adminHandler the admin one (/metrics, /healthz, /livez).
	handler      http.Handler
	apiHandler   http.Handler
	adminHandler http.Handler
	ping         func(context.Context) error
	close        func()
	// sweep runs the retention sweep on its schedule until its context
	// ends; nil when Config.Cleanup is CleanupOff.
	sweep func(context.Context) error
	// relay publishes the outbox to Kafka and consume applies the order
	// events to the projection, until their context ends; nil when
	// Config.Kafka is off.
	relay, consume func(context.Context) error
	// flush publishes one batch of the outbox and returns how many events
	// it published; shutdown calls it until it returns 0.
	flush func(context.Context) (int, error)
	// saga runs the order payment saga's consumer and its compensator
	// until its context ends; nil when Config.Kafka is off.
	saga func(context.Context) error
	// watchdog drives the orders whose saga stopped moving (see
	// Config.SagaStuckAfter); nil when Config.Kafka is off.
	watchdog func(context.Context) error
	// lagCheck measures the consumer groups' lag every kafkaLagInterval
	// until its context ends; nil when Config.Kafka is off.
	lagCheck func(context.Context) error
	// parked counts the events parked in the outbox
	// (idemd_outbox_parked_events) every parkedEvery (parkedInterval
	// when 0) and after each park, until its context ends.
	parked      *parkedChecker
	parkedEvery time.Duration
	// kafka describes the Kafka in use, for the listen line; started is
	// what Serve logs about it when the pipeline starts.
	kafka   string
	started []any
	// driverName is the database driver's name, for the start-up log.
	driverName string
	// kafkaSeeds are the seed brokers of the events' Kafka (none when it
	// is off), for GET /v1/kafka.
	kafkaSeeds []string
	// enqueued wakes the relay after a POST /v1/orders whose transaction
	// has committed (ListenOutbox does it on PostgreSQL, across replicas).
	enqueued chan struct{}
	// tracer and propagator trace the components (WithTelemetry); nil
	// traces nothing.
	tracer     observe.Tracer
	propagator observe.Propagator
	// fatal receives the first failure that leaves this process unable to
	// do its work (a worker that stopped, the embedded broker's lease
	// taken by another idemd): Serve shuts down and returns it, so that
	// the process exits 1 and its supervisor restarts it, rather than
	// serving on with /healthz green.
	fatal chan error
}

// fail reports a fatal failure to Serve (the first one is kept).
func (a *App) fail(err error) {
	select {
	case a.fatal <- err:
	default:
	}
}

// New opens and migrates the database of cfg, starts the embedded Kafka
// broker if configured, and builds the handler. A PostgreSQL database that
// does not accept connections yet is retried until ctx ends (see
// reachDatabase): bound ctx. The caller must Close the App. log may be nil
// (slog.Default()).
func New(ctx context.Context, cfg Config, log *slog.Logger, opts ...Option) (*App, error) {
	if log == nil {
		log = slog.Default()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Kafka.Mode == "" {
		cfg.Kafka.Mode = DefaultKafka
	}
	if cfg.KafkaTopic == "" {
		cfg.KafkaTopic = DefaultKafkaTopic
	}
	if cfg.KafkaSessionTimeout <= 0 {
		cfg.KafkaSessionTimeout = ConsumerSessionTimeout
	}
	a := &App{cfg: cfg, log: log, metrics: newMetrics(), enqueued: make(chan struct{}, 1), fatal: make(chan error, 1)}
	for _, o := range opts {
		o(a)
	}
	if a.tracer != nil {
		// The lines logged in a span's context carry its IDs.
		a.log = withTraceIDs(a.log, a.propagator)
	}
	var err error
	switch cfg.DB.Kind {
	case Postgres:
		err = a.openPostgres(ctx)
	case SQLite:
		err = a.openSQLite(ctx)
	default:
		err = fmt.Errorf("unknown database kind %q", cfg.DB.Kind)
	}
	if err != nil {
		return nil, err
	}
	return a, nil
}

// stores are the domain stores of one database.
type stores[TTx any] struct {
	payments payments.Store[TTx]
	orders   orders.Store[TTx]
	// migrate creates the domain tables.
	migrate []func(context.Context) error
	// statuses read the domain tables' migrations, for newerSchemaWarning.
	statuses []domainTables
	// wake, if set, returns the relay's wake-up channel, until ctx ends.
	wake func(ctx context.Context) (<-chan struct{}, error)
	// stale lists the orders still CREATED, for the watchdog.
	stale orders.StaleLister
	// identity names the database, for the embedded broker's log.
	identity func(ctx context.Context) (dbIdentity, error)
	// privileges, if set, refuses a role that lacks a privilege on idem's
	// or idemd's tables (PostgreSQL).
	privileges func(ctx context.Context) error
}

func (a *App) openPostgres(ctx context.Context) error {
	pcfg, err := a.cfg.DB.poolConfig()
	if err != nil {
		return fmt.Errorf("database %s: %s", a.cfg.DB, errMessage(err))
	}
	pcfg.PrepareConn = dropReadOnly
	pcfg.AfterConnect = askReadOnly
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err == nil {
		err = a.reachDatabase(ctx, pool.Ping)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return fmt.Errorf("database %s unreachable: %s", a.cfg.DB, errMessage(err))
	}
	dcfg := pgdriver.Config{NoOutboxNotify: a.cfg.DBNoNotify}
	if a.cfg.DBListen != "" {
		// As a pool's URL, like -db's: its pool_* parameters (a copy of
		// -db's URL with pool_max_conns) are the pool's, not settings to
		// send to the server, which refuses them and the LISTEN with them.
		lcfg, err := pgxpool.ParseConfig(a.cfg.DBListen)
		if err != nil {
			pool.Close()
			return fmt.Errorf("-db-listen: %s", errMessage(err))
		}
		dcfg.ListenConnConfig = lcfg.ConnConfig
		dcfg.ListenBeforeConnect = a.cfg.DB.listenBeforeConnect()
	}
	drv, err := pgdriver.New(pool, &dcfg)
	if err != nil {
		pool.Close()
		return err
	}
	pay, ord := pgstore.New(pool), ordpg.New(pool)
	a.ping, a.close = pay.Ping, pool.Close
	return setup(ctx, a, drv, stores[pgx.Tx]{
		payments: pay,
		orders:   ord,
		stale:    ord,
		migrate:  []func(context.Context) error{pay.Migrate, ord.Migrate},
		statuses: []domainTables{
			{table: "payment_migration", status: pay.MigrationStatus},
			{table: "order_migration", status: ord.MigrationStatus},
		},
		wake: func(ctx context.Context) (<-chan struct{}, error) {
			// The listener reports each failed reconnection (every 5 s
			// while the database is down), then nil once reconnected.
			fails := &failureLog{log: a.log, recovered: "outbox listener reconnected",
				failed: "outbox listener failed", stillFailing: "outbox listener still failing",
				countKey: "failed_attempts"}
			return drv.ListenOutbox(ctx, fails.observe)
		},
		identity: func(ctx context.Context) (dbIdentity, error) { return postgresIdentity(ctx, pool) },
		privileges: func(ctx context.Context) error {
			if err := drv.CheckPrivileges(ctx); err != nil {
				return err
			}
			return postgresPrivileges(ctx, pool)
		},
	})
}

// pgPrivilegesSQL lists the privileges the session's role lacks on idemd's
// own tables (those that exist), of those its statements use (no DELETE:
// idemd deletes no payment nor order; no UPDATE of a payment):
// (table, privileges, role, schema).
const pgPrivilegesSQL = `SELECT t, string_agg(p, ', ' ORDER BY i), current_user::text, coalesce(current_schema(), '')
	FROM (VALUES ('payment_migration', 'SELECT', 0), ('order_migration', 'SELECT', 1), ('idemd_instance', 'SELECT', 2),
		('payment', 'SELECT', 3), ('payment', 'INSERT', 4),
		('customer_order', 'SELECT', 5), ('customer_order', 'INSERT', 6), ('customer_order', 'UPDATE', 7),
		('customer_order_summary', 'SELECT', 8), ('customer_order_summary', 'INSERT', 9),
		('customer_order_summary', 'UPDATE', 10)) AS c(t, p, i)
	WHERE to_regclass(t) IS NOT NULL AND NOT has_table_privilege(to_regclass(t), p)
	GROUP BY t ORDER BY min(i)`

// postgresPrivileges refuses a role that lacks a privilege on idemd's own
// tables (created by idemd migrate up as their owner): every payment or
// order would fail from the first one on.
func postgresPrivileges(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, pgPrivilegesSQL)
	if err != nil {
		return fmt.Errorf("read the role's privileges on idemd's tables: %w", err)
	}
	var lacks []string
	var role, schema string
	for rows.Next() {
		var t, p string
		if err := rows.Scan(&t, &p, &role, &schema); err != nil {
			rows.Close()
			return fmt.Errorf("read the role's privileges on idemd's tables: %w", err)
		}
		lacks = append(lacks, t+" ("+p+")")
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the role's privileges on idemd's tables: %w", err)
	}
	if len(lacks) == 0 {
		return nil
	}
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	return fmt.Errorf("the role %s lacks privileges on idemd's tables: %s; as their owner, run GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO %s "+
		"(and ALTER DEFAULT PRIVILEGES for the tables later migrations create: README \"Roles and privileges\")",
		id(role), strings.Join(lacks, ", "), id(schema), id(role))
}

func (a *App) openSQLite(ctx context.Context) error {
	drv, err := sqlitedriver.Open(a.cfg.DB.Path, nil)
	if err != nil {
		return fmt.Errorf("database %s unusable: %s", a.cfg.DB, errMessage(err))
	}
	pay, ord := sqlitestore.New(drv.DB()), ordsqlite.New(drv.DB())
	a.ping, a.close = pay.Ping, func() { _ = drv.Close() }
	return setup(ctx, a, drv, stores[*sql.Tx]{
		payments: pay,
		orders:   ord,
		stale:    ord,
		migrate:  []func(context.Context) error{pay.Migrate, ord.Migrate},
		statuses: []domainTables{
			{table: "payment_migration", status: pay.MigrationStatus},
			{table: "order_migration", status: ord.MigrationStatus},
		},
		identity: func(ctx context.Context) (dbIdentity, error) {
			abs, err := filepath.Abs(a.cfg.DB.Path)
			if err != nil {
				return dbIdentity{}, fmt.Errorf("identify the database: %w", err)
			}
			inst, err := sqliteInstance(ctx, drv.DB())
			return dbIdentity{Where: "sqlite:" + abs, Instance: inst}, err
		},
	})
}

// Start-up retries of an unreachable database: the first after
// reachFirstWait, each next one twice as late, at most reachMaxWait apart.
const (
	reachFirstWait = 250 * time.Millisecond
	reachMaxWait   = 4 * time.Second
)

// reachDatabase pings the database until it answers, retrying its passing
// failures (dberr.Transient: a refused connection, a server starting up or
// out of connections; and a host name that does not resolve, yet: a
// StatefulSet's pod gets its DNS name once ready) with backoff
// until ctx ends (the start-up bound, or the signal): a database that
// starts after idemd (a sidecar proxy, a cluster coming up) is waited for
// rather than failing the start, which a supervisor such as Kubernetes
// would repeat with a growing back-off. Any other failure (a password or
// a database name refused) returns at once. On ctx's end it returns the
// last failure, which says why the database did not answer.
func (a *App) reachDatabase(ctx context.Context, ping func(context.Context) error) error {
	start := time.Now()
	var last error
	for attempt, wait := 1, reachFirstWait; ; attempt, wait = attempt+1, min(2*wait, reachMaxWait) {
		err := ping(ctx)
		if err == nil {
			if attempt > 1 {
				a.log.Info("database reachable", "database", a.cfg.DB.String(), "attempts", attempt, "waited", since(start))
			}
			return nil
		}
		if ctx.Err() != nil && last != nil {
			return fmt.Errorf("%w (tried %d times in %s)", last, attempt-1, since(start))
		}
		var dns *net.DNSError
		if retry := dberr.Transient(err) || errors.As(err, &dns); !retry || ctx.Err() != nil {
			return err
		}
		last = err
		a.log.Warn("database unreachable at start-up; retrying", "database", a.cfg.DB.String(),
			"attempt", attempt, "retry_in", wait.String(), "err", errMessage(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (tried %d times in %s)", last, attempt, since(start))
		case <-time.After(wait):
		}
	}
}

// dbIdentity names a database for the embedded broker's log: where it is,
// for people, and which database it is, for the check (Instance, a random
// ID the database gets when idemd first starts on it: a database deleted
// and created again at the same place is another one).
type dbIdentity struct {
	Where    string
	Instance string
}

// instanceTableSQL holds the database's instance ID: one row, written once.
const (
	pgInstanceTableSQL = `CREATE TABLE IF NOT EXISTS idemd_instance (
		singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
		id         text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`
	sqliteInstanceTableSQL = `CREATE TABLE IF NOT EXISTS idemd_instance (
		singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
		id         TEXT NOT NULL,
		created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ')))`
)

// postgresIdentity names the database: its name and schema (where idemd's
// tables are) on the cluster's system identifier (or, for a role that may
// not read it, the server's address), and its instance ID.
func postgresIdentity(ctx context.Context, pool *pgxpool.Pool) (dbIdentity, error) {
	var db, schema, sys string
	err := pool.QueryRow(ctx, `SELECT current_database(), coalesce(current_schema(), ''), system_identifier::text
		FROM pg_control_system()`).Scan(&db, &schema, &sys)
	if err != nil {
		err = pool.QueryRow(ctx, `SELECT current_database(), coalesce(current_schema(), ''),
			coalesce(host(inet_server_addr()), 'socket') || ':' || coalesce(inet_server_port()::text, '')`).Scan(&db, &schema, &sys)
	}
	if err != nil {
		return dbIdentity{}, fmt.Errorf("identify the database: %w", err)
	}
	id := dbIdentity{Where: "postgres:" + db + "." + schema + "@" + sys}
	// Named already (idemd migrate up, an earlier start): no DDL, which a
	// role without CREATE rights on the schema may not run even with IF
	// NOT EXISTS.
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idemd_instance') IS NOT NULL`).Scan(&exists); err != nil {
		return dbIdentity{}, fmt.Errorf("identify the database: %w", err)
	}
	if exists {
		err := pool.QueryRow(ctx, `SELECT id FROM idemd_instance`).Scan(&id.Instance)
		switch {
		case err == nil:
			return id, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return dbIdentity{}, fmt.Errorf("identify the database: %w", err)
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Replicas starting together: the lock orders the CREATE TABLEs.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idemd_instance:' || current_schema()))`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, pgInstanceTableSQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO idemd_instance (id) VALUES ($1) ON CONFLICT (singleton) DO NOTHING`, newInstanceID()); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT id FROM idemd_instance`).Scan(&id.Instance)
	})
	if err != nil {
		return dbIdentity{}, fmt.Errorf("identify the database: %w", err)
	}
	return id, nil
}

// sqliteInstance returns the instance ID of a SQLite database, giving it
// one on first use.
func sqliteInstance(ctx context.Context, db *sql.DB) (string, error) {
	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (sqlitedriver): one writer at a time
	if err != nil {
		return "", fmt.Errorf("identify the database: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var id string
	if _, err = tx.ExecContext(ctx, sqliteInstanceTableSQL); err == nil {
		if _, err = tx.ExecContext(ctx, `INSERT INTO idemd_instance (singleton, id) VALUES (1, ?) ON CONFLICT (singleton) DO NOTHING`, newInstanceID()); err == nil {
			if err = tx.QueryRowContext(ctx, `SELECT id FROM idemd_instance`).Scan(&id); err == nil {
				err = tx.Commit()
			}
		}
	}
	if err != nil {
		return "", fmt.Errorf("identify the database: %w", err)
	}
	return id, nil
}

// newInstanceID is a random, time-ordered ID (UUIDv7).
func newInstanceID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// setup migrates idem's tables and the domain tables, then builds the
// handler for the transaction type of the database, the retention sweep,
// and the order pipeline (Kafka, relay, consumer).
func setup[TTx any](ctx context.Context, a *App, drv driver.Driver[TTx], st stores[TTx]) error {
	err := drv.Migrate(ctx)
	if v, ok := drv.(interface{ Validate(context.Context) error }); ok && err == nil {
		// The schema, and on PostgreSQL the sessions' isolation level
		// (idem's claims need READ COMMITTED): refused at start-up.
		err = v.Validate(ctx)
	}
	if p, ok := drv.(interface{ TransactionPooling() bool }); ok && err == nil && p.TransactionPooling() {
		msg := "database reached through a pooler: idem's claims keep their locks in their transactions"
		switch {
		case a.cfg.Kafka.Mode == KafkaOff:
		case a.cfg.DBListen != "":
			msg += "; the relay LISTENs on -db-listen"
		default:
			msg += "; the relay polls for other replicas' events every second (-db-listen: a direct URL for LISTEN)"
		}
		a.log.Info(msg, "db", a.cfg.DB.String())
	}
	for _, m := range st.migrate {
		if err == nil {
			err = m(ctx)
		}
	}
	if err == nil && st.privileges != nil {
		// A role that lacks a privilege on a table (one a migration
		// created without a grant for it) is refused here, not at the
		// first request.
		err = st.privileges(ctx)
	}
	if err == nil {
		a.warnNewerSchema(ctx, drv, st.statuses)
	}
	if err == nil {
		a.driverName = drv.Name()
		err = routes(a, drv, st)
	}
	if err == nil {
		every := a.parkedEvery
		if every <= 0 {
			every = parkedInterval
		}
		a.parked = &parkedChecker{
			count:    func(ctx context.Context) (int, error) { return outbox.CountParked(ctx, drv) },
			m:        a.metrics,
			log:      a.log,
			interval: every,
			wake:     make(chan struct{}, 1),
		}
	}
	if err == nil && a.cfg.Cleanup != CleanupOff {
		var c *cleanup.Cleaner[TTx]
		cc := &cleanup.Config{
			Schedule: a.cfg.Cleanup,
			Logger:   a.log,
			OnSweep:  a.metrics.sweep,
			Tracer:   a.tracer,
		}
		if a.cfg.Kafka.Mode == KafkaEmbedded {
			// What the embedded broker keeps is known: the sweep
			// checks it against the inboxes' retention.
			cc.Inbox.RedeliveryHorizon = EmbeddedRetention
		}
		c, err = cleanup.New(drv, cc)
		if err == nil {
			a.sweep = c.Run
		}
	}
	if err != nil {
		a.close()
		return fmt.Errorf("database %s: %s", a.cfg.DB, errMessage(err))
	}
	if err := pipeline(ctx, a, drv, st); err != nil {
		a.close()
		var (
			ce *ConfigError
			ke *kafkaError // names the cluster already
		)
		if errors.As(err, &ce) || errors.As(err, &ke) {
			return err
		}
		return fmt.Errorf("kafka %s: %s", a.cfg.Kafka, errMessage(err))
	}
	return nil
}

// routes builds the handlers (a.handler, a.apiHandler, a.adminHandler):
// access log and metrics around a ServeMux whose routing errors are
// problems.
func routes[TTx any](a *App, drv driver.Driver[TTx], st stores[TTx]) error {
	// One middleware per endpoint, whose MaxBodyBytes is the endpoint's
	// own limit: every body over it gets the middleware's 413
	// body-too-large, whatever its size, before a key is claimed.
	idem := func(maxBody int64) (*idemhttp.Middleware[TTx], error) {
		return idemhttp.New(drv, &idemhttp.Config{
			Scope:        scope,
			OnOutcome:    a.metrics.outcome,
			Logger:       a.log,
			MaxBodyBytes: maxBody,
			Tracer:       a.tracer,
		})
	}
	idemPayments, err := idem(payments.MaxRequestBytes)
	if err != nil {
		return err
	}
	idemOrders, err := idem(orders.MaxRequestBytes)
	if err != nil {
		return err
	}
	a.metrics.caches.use("payments", idemPayments.CacheStats)
	a.metrics.caches.use("orders", idemOrders.CacheStats)
	h := payments.NewHandler(st.payments, a.log)
	o := orders.NewHandler(st.orders, drv, a.cfg.Kafka.Mode != KafkaOff, a.log)
	// apijson.RequireJSON answers 415 in front of the middleware: a missing
	// or wrong Content-Type claims no key, so the corrected request may
	// reuse it.
	// Every /v1 request's work is bounded (Config.RequestTimeout): a
	// database that stalls (a lock held, the pool's connections all
	// taken) answers 503 with Retry-After, not a wait as long as the
	// client's.
	api := func(h http.Handler) http.Handler { return withDeadline(a.cfg.RequestTimeout, authenticate(h)) }
	apiRoutes := map[string]http.Handler{
		"POST /v1/payments": api(apijson.RequireJSON("payment",
			idemPayments.Handler(http.HandlerFunc(h.Create)))),
		"GET /v1/payments/{id}": api(http.HandlerFunc(h.Get)),
		"POST /v1/orders": api(apijson.RequireJSON("order",
			a.wakeRelay(idemOrders.Handler(http.HandlerFunc(o.Create))))),
		"GET /v1/orders/{id}":            api(http.HandlerFunc(o.Get)),
		"GET /v1/customers/{id}/summary": api(http.HandlerFunc(o.Summary)),
		"GET /v1/kafka":                  http.HandlerFunc(a.kafkaInfo),
	}
	// The probes are on both listeners: a load balancer probes the port
	// it sends traffic to, Kubernetes the one its kubelet may reach.
	probes := map[string]http.Handler{
		"GET /healthz": http.HandlerFunc(a.healthz),
		"GET /livez":   http.HandlerFunc(a.livez),
	}
	metricsRoute := map[string]http.Handler{"GET /metrics": a.metrics.handler()}
	serve := func(routes ...map[string]http.Handler) http.Handler {
		mux := http.NewServeMux()
		for _, rs := range routes {
			for pattern, h := range rs {
				mux.Handle(pattern, h)
			}
		}
		return a.observe(problemRouting(mux))
	}
	a.handler = serve(apiRoutes, probes, metricsRoute)
	a.apiHandler = serve(apiRoutes, probes)
	a.adminHandler = serve(probes, metricsRoute)
	return nil
}

// withDeadline runs next with a request context that ends after d: the
// database calls made with it (a connection's acquisition, a statement
// waiting for a lock) end then, and the request answers 503
// store-unavailable with Retry-After (idemhttp, and the handlers'
// apijson.WriteUnavailable), its transaction rolled back.
func withDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// wakeRelay signals a.enqueued after next returns: the middleware has then
// committed (or rolled back) the request's transaction. The signal is
// coalesced and never blocks.
func (a *App) wakeRelay(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		select {
		case a.enqueued <- struct{}{}:
		default:
		}
	})
}

// Handler is the application's HTTP handler.
func (a *App) Handler() http.Handler { return a.handler }

// Close closes the Kafka publisher, the embedded broker and the database,
// in that order. Call it after Serve returned.
func (a *App) Close() { a.close() }

package app

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/payments"
	"github.com/idemkit/idem/internal/payments/pgstore"
	"github.com/idemkit/idem/internal/payments/sqlitestore"
)

// App is a configured idemd: an open, migrated database and its HTTP
// handler.
type App struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	handler http.Handler
	ping    func(context.Context) error
	close   func()
	// sweep runs the retention sweep on its schedule until its context
	// ends; nil when Config.Cleanup is CleanupOff.
	sweep func(context.Context) error
}

// New opens and migrates the database of cfg and builds the handler. The
// caller must Close the App. log may be nil (slog.Default()).
func New(ctx context.Context, cfg Config, log *slog.Logger) (*App, error) {
	if log == nil {
		log = slog.Default()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	a := &App{cfg: cfg, log: log, metrics: newMetrics()}
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

func (a *App) openPostgres(ctx context.Context) error {
	pcfg, err := pgxpool.ParseConfig(a.cfg.DB.URL)
	if err != nil {
		return fmt.Errorf("database %s: %s", a.cfg.DB, errMessage(err))
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return fmt.Errorf("database %s unreachable: %s", a.cfg.DB, errMessage(err))
	}
	drv, err := pgdriver.New(pool, nil)
	if err != nil {
		pool.Close()
		return err
	}
	store := pgstore.New(pool)
	a.ping, a.close = store.Ping, pool.Close
	return setup[pgx.Tx](ctx, a, drv, store, store.Migrate)
}

func (a *App) openSQLite(ctx context.Context) error {
	drv, err := sqlitedriver.Open(a.cfg.DB.Path, nil)
	if err != nil {
		return fmt.Errorf("database %s unusable: %s", a.cfg.DB, errMessage(err))
	}
	store := sqlitestore.New(drv.DB())
	a.ping, a.close = store.Ping, func() { _ = drv.Close() }
	return setup[*sql.Tx](ctx, a, drv, store, store.Migrate)
}

// setup migrates idem's tables and the payment table, then builds the
// handler for the transaction type of the database and the retention
// sweep.
func setup[TTx any](ctx context.Context, a *App, drv driver.Driver[TTx], store payments.Store[TTx], migrate func(context.Context) error) error {
	err := drv.Migrate(ctx)
	if err == nil {
		err = migrate(ctx)
	}
	if err == nil {
		a.handler, err = routes(a, drv, store)
	}
	if err == nil && a.cfg.Cleanup != CleanupOff {
		var c *cleanup.Cleaner[TTx]
		c, err = cleanup.New(drv, &cleanup.Config{
			Schedule: a.cfg.Cleanup,
			Logger:   a.log,
			OnSweep:  a.metrics.sweep,
		})
		if err == nil {
			a.sweep = c.Run
		}
	}
	if err != nil {
		a.close()
		return fmt.Errorf("database %s: %s", a.cfg.DB, errMessage(err))
	}
	return nil
}

// routes builds the handler: access log and metrics around a ServeMux
// whose routing errors are problems.
func routes[TTx any](a *App, drv driver.Driver[TTx], store payments.Store[TTx]) (http.Handler, error) {
	idem, err := idemhttp.New(drv, &idemhttp.Config{
		Scope:     scope,
		OnOutcome: a.metrics.outcome,
		Logger:    a.log,
	})
	if err != nil {
		return nil, err
	}
	h := payments.NewHandler(store, a.log)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", authenticate(idem.Handler(http.HandlerFunc(h.Create))))
	mux.Handle("GET /v1/payments/{id}", authenticate(http.HandlerFunc(h.Get)))
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.Handle("GET /metrics", a.metrics.handler())
	return a.observe(problemRouting(mux)), nil
}

// Handler is the application's HTTP handler.
func (a *App) Handler() http.Handler { return a.handler }

// Close closes the database.
func (a *App) Close() { a.close() }

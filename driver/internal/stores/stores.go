// Package stores gives a backend whose one executor serves every table the
// per-table stores of package driver (Records, Inbox, Outbox, Sagas, Locks
// and their ...Tx forms), by embedding.
package stores

import "github.com/idemkit/idem/driver"

// Executors is what a backend has: its executor outside any transaction and
// in one.
type Executors[TTx any] interface {
	Executor() driver.Executor
	UnwrapExecutor(tx TTx) driver.Executor
}

// Of implements driver.RecordStore, InboxStore, OutboxStore, SagaStore and
// LockStore over Executors. A backend embeds it under an unexported alias
// (type tableStores = stores.Of[pgx.Tx]), set with New once the backend
// exists.
type Of[TTx any] struct{ e Executors[TTx] }

// New returns the stores of e.
func New[TTx any](e Executors[TTx]) Of[TTx] { return Of[TTx]{e} }

// Records implements driver.RecordStore.
func (s Of[TTx]) Records() driver.RecordExecutor { return s.e.Executor() }

// RecordsTx implements driver.RecordStore.
func (s Of[TTx]) RecordsTx(tx TTx) driver.RecordExecutor { return s.e.UnwrapExecutor(tx) }

// Inbox implements driver.InboxStore.
func (s Of[TTx]) Inbox() driver.InboxExecutor { return s.e.Executor() }

// InboxTx implements driver.InboxStore.
func (s Of[TTx]) InboxTx(tx TTx) driver.InboxExecutor { return s.e.UnwrapExecutor(tx) }

// Outbox implements driver.OutboxStore.
func (s Of[TTx]) Outbox() driver.OutboxExecutor { return s.e.Executor() }

// OutboxTx implements driver.OutboxStore.
func (s Of[TTx]) OutboxTx(tx TTx) driver.OutboxExecutor { return s.e.UnwrapExecutor(tx) }

// Sagas implements driver.SagaStore.
func (s Of[TTx]) Sagas() driver.SagaExecutor { return s.e.Executor() }

// SagasTx implements driver.SagaStore.
func (s Of[TTx]) SagasTx(tx TTx) driver.SagaExecutor { return s.e.UnwrapExecutor(tx) }

// Locks implements driver.LockStore.
func (s Of[TTx]) Locks() driver.LockExecutor { return s.e.Executor() }

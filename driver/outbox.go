package driver

// OutboxExecutor is the storage of the transactional outbox (table outbox).
// Its methods are added by the outbox work; see package outbox.
type OutboxExecutor interface{}

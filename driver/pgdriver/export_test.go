package pgdriver

// RecordLockKey exposes the advisory lock of (scope, key) to the tests.
func (d *Driver) RecordLockKey(scope, key string) int64 { return d.recordLockKey(scope, key) }

// ForgetPooled makes the driver forget a detected pooler, as if its first
// claim had missed it.
func (d *Driver) ForgetPooled() { d.pooled.Store(false) }

// AskReadOnly makes the relay's claim ask whether its session is read-only,
// as on a server that does not report it (before PostgreSQL 14).
func (d *Driver) AskReadOnly() { d.askReadOnly = true }

// MaintenanceLockKey exposes the advisory lock that migrations and
// partition maintenance of the driver's schema hold (Config.Schema set).
func (d *Driver) MaintenanceLockKey() int64 { return d.names.MigrateLockKey() }

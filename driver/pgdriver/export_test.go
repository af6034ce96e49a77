package pgdriver

// RecordLockKey exposes the advisory lock of (scope, key) to the tests.
func (d *Driver) RecordLockKey(scope, key string) int64 { return d.recordLockKey(scope, key) }

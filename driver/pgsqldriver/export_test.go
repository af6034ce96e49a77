package pgsqldriver

// OpenTxContexts returns how many transactions of d's Begin and BeginClaim
// have their context still registered.
func OpenTxContexts(d *Driver) int {
	d.txs.mu.Lock()
	defer d.txs.mu.Unlock()
	return len(d.txs.m)
}

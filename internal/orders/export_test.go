package orders

import "time"

// SetClock sets the clock of p's Recover (time.Now by default).
func SetClock[TTx any](p *PaymentSaga[TTx], now func() time.Time) { p.now = now }

// SetRecoverTimeout sets the bound of RunCompensator's Recover calls
// (RecoverTimeout by default); call it before RunCompensator.
func SetRecoverTimeout[TTx any](p *PaymentSaga[TTx], d time.Duration) { p.recoverTimeout = d }

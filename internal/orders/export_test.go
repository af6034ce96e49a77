package orders

import "time"

// SetClock sets the clock of p's Recover (time.Now by default).
func SetClock[TTx any](p *PaymentSaga[TTx], now func() time.Time) { p.now = now }

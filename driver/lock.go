package driver

import (
	"context"
	"time"
)

// LockExecutor is the storage of named leases (table idem_lock): one row
// (name, owner, expires_at) per lease. Replicas of a service use a lease so
// that exactly one of them runs a periodic job (the cleanup sweep); the others
// see it taken and skip.
//
// Ownership is continuous for as long as the row names the owner: a takeover
// rewrites owner, a release deletes the row. Times are the caller's clock,
// compared with other callers': callers on other hosts should use the
// database's (see Clock; cleanup's default clock does), or a lease must be
// long compared with the clock skew between them.
type LockExecutor interface {
	// LockAcquire takes the lease p.Name for p.Owner until p.Until, in ONE
	// statement (INSERT ... ON CONFLICT DO UPDATE ... WHERE): it inserts the
	// row, or takes over a row whose expires_at is not after p.Now, or extends
	// it when p.Owner already holds it. It returns true when p.Owner holds the
	// lease afterwards and false when another owner holds a live lease.
	// Concurrent callers never both get true for a live lease.
	LockAcquire(ctx context.Context, p *LockAcquireParams) (bool, error)

	// LockRenew moves the expiry of the lease p.Name that p.Owner holds to
	// p.Until (earlier or later). ErrLeaseLost when the row no longer names
	// p.Owner (another
	// owner took the expired lease over, or it was released).
	LockRenew(ctx context.Context, p *LockRenewParams) error

	// LockRelease deletes the lease p.Name if p.Owner holds it, so another
	// owner may take it at once. ErrLeaseLost when p.Owner does not hold it.
	LockRelease(ctx context.Context, p *LockReleaseParams) error

	// LockGet returns the owner and expiry of the lease p.Name, expired or
	// not, or ErrNotFound when there is no row.
	LockGet(ctx context.Context, p *LockGetParams) (owner string, expiresAt time.Time, err error)
}

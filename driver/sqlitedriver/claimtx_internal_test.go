package sqlitedriver

import (
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

// TestBeginClaimKeepsLateBegin: the connection is freed just as a claim's
// wait runs out, and its Begin finishes before the claim looks. On a loaded
// machine this happens when the first of many concurrent duplicates is
// slow to run: it must still get the key, not answer "in progress" with
// nobody executing it.
func TestBeginClaimKeepsLateBegin(t *testing.T) {
	d := openMigrated(t)
	ctx := t.Context()
	holder, err := d.Begin(ctx) // holds the only connection
	if err != nil {
		t.Fatal(err)
	}
	testHookWaitRanOut = func(begun func() bool) {
		_ = holder.Rollback()
		deadline := time.Now().Add(time.Minute)
		for !begun() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	t.Cleanup(func() { testHookWaitRanOut = nil })
	tx, res, err := d.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "k", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Locked {
		t.Fatal("not locked: the Begin that finished after the wait ran out was thrown away")
	}
	// The transaction is alive: it writes and commits.
	if err := d.CommitComplete(ctx, tx, &driver.TxCompleteParams{Scope: "s", Key: "k", Fingerprint: []byte("f"),
		Status: 201, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
}

package drivertest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

const (
	testScope = "tenant-1 POST /payments"
	leaseTTL  = 30 * time.Second
	recordTTL = 24 * time.Hour
)

// t0 is the clock the record scenarios start from. The drivers compare times
// given by the caller only, never the database clock, so a fixed instant
// keeps the boundaries exact. It is a whole microsecond (the precision every
// backend keeps) in a zone other than UTC and Local, so a backend that loses
// the instant when converting zones is caught.
var t0 = time.Date(2031, 3, 14, 15, 9, 26, 535897000, time.FixedZone("UTC+05:30", 5*3600+1800))

// newToken returns a unique lease token, as the middleware makes one per
// attempt.
func newToken() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "lease-" + hex.EncodeToString(b)
}

// claimAt builds the parameters of a claim of key in testScope made at now,
// with the usual lease and record lifetimes.
func claimAt(key, fingerprint, token string, now time.Time) *driver.RecordClaimParams {
	return &driver.RecordClaimParams{
		Scope:          testScope,
		Key:            key,
		Fingerprint:    []byte(fingerprint),
		LeaseToken:     token,
		LeaseExpiresAt: now.Add(leaseTTL),
		Now:            now,
		ExpiresAt:      now.Add(recordTTL),
	}
}

// inProgress is the record a successful claim p must have left.
func inProgress(p *driver.RecordClaimParams) *driver.Record {
	return &driver.Record{
		Scope:          p.Scope,
		Key:            p.Key,
		Fingerprint:    p.Fingerprint,
		State:          driver.StateInProgress,
		LeaseToken:     p.LeaseToken,
		LeaseExpiresAt: p.LeaseExpiresAt,
		CreatedAt:      p.Now,
		ExpiresAt:      p.ExpiresAt,
	}
}

// completed is the record left by claim p followed by complete c.
func completed(p *driver.RecordClaimParams, c *driver.RecordCompleteParams) *driver.Record {
	r := inProgress(p)
	r.State = driver.StateCompleted
	r.Status = c.Status
	r.Headers = c.Headers
	r.Body = c.Body
	r.LeaseToken = ""
	r.LeaseExpiresAt = time.Time{}
	return r
}

func completeParams(p *driver.RecordClaimParams, status int, headers, body []byte) *driver.RecordCompleteParams {
	return &driver.RecordCompleteParams{
		Scope:      p.Scope,
		Key:        p.Key,
		LeaseToken: p.LeaseToken,
		Status:     status,
		Headers:    headers,
		Body:       body,
	}
}

func claim(t *testing.T, ex driver.Executor, p *driver.RecordClaimParams) *driver.RecordClaimResult {
	t.Helper()
	res, err := ex.RecordClaim(t.Context(), p)
	if err != nil {
		t.Fatalf("RecordClaim(%q, %q, token %s, now %s): %v", p.Scope, p.Key, p.LeaseToken, p.Now, err)
	}
	if res == nil {
		t.Fatalf("RecordClaim(%q, %q): nil result and nil error", p.Scope, p.Key)
	}
	return res
}

// mustClaim claims p and fails unless the caller now owns the key.
func mustClaim(t *testing.T, ex driver.Executor, p *driver.RecordClaimParams) {
	t.Helper()
	res := claim(t, ex, p)
	if !res.Claimed {
		t.Fatalf("RecordClaim(%q, token %s, now %s): Claimed=false, Existing=%s; want Claimed", p.Key, p.LeaseToken, p.Now, fmtRecord(res.Existing))
	}
	if res.Existing != nil {
		t.Errorf("RecordClaim(%q): Claimed=true with Existing=%s; want Existing nil", p.Key, fmtRecord(res.Existing))
	}
}

// mustFindExisting claims p, fails if that claimed the key, and checks the
// live record returned against want.
func mustFindExisting(t *testing.T, ex driver.Executor, p *driver.RecordClaimParams, want *driver.Record) {
	t.Helper()
	res := claim(t, ex, p)
	if res.Claimed {
		t.Fatalf("RecordClaim(%q, token %s, now %s): Claimed=true; want the existing record %s", p.Key, p.LeaseToken, p.Now, fmtRecord(want))
	}
	if res.Existing == nil {
		t.Fatalf("RecordClaim(%q): Claimed=false and Existing=nil", p.Key)
	}
	if d := diffRecord(res.Existing, want); d != "" {
		t.Errorf("RecordClaim(%q, token %s, now %s): Existing differs:\n%s", p.Key, p.LeaseToken, p.Now, d)
	}
}

func complete(t *testing.T, ex driver.Executor, c *driver.RecordCompleteParams) {
	t.Helper()
	if err := ex.RecordComplete(t.Context(), c); err != nil {
		t.Fatalf("RecordComplete(%q, token %s): %v", c.Key, c.LeaseToken, err)
	}
}

// mustGet reads (scope, key) and compares it with want.
func mustGet(t *testing.T, ex driver.Executor, scope, key string, want *driver.Record) {
	t.Helper()
	got, err := ex.RecordGet(t.Context(), &driver.RecordGetParams{Scope: scope, Key: key})
	if err != nil {
		t.Fatalf("RecordGet(%q, %q): %v", scope, key, err)
	}
	if d := diffRecord(got, want); d != "" {
		t.Errorf("RecordGet(%q, %q) differs:\n%s", scope, key, d)
	}
}

func mustNotFind(t *testing.T, ex driver.Executor, scope, key string) {
	t.Helper()
	got, err := ex.RecordGet(t.Context(), &driver.RecordGetParams{Scope: scope, Key: key})
	if !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("RecordGet(%q, %q) = %s, %v; want ErrNotFound", scope, key, fmtRecord(got), err)
	}
}

func wantLeaseLost(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("%s: err = %v; want driver.ErrLeaseLost", what, err)
	}
}

// diffRecord lists the fields in which got differs from want. Times are
// compared as instants; bytes byte for byte (a nil and an empty slice are
// the same zero-length value).
func diffRecord(got, want *driver.Record) string {
	if got == nil || want == nil {
		if got == want {
			return ""
		}
		return fmt.Sprintf("  got  %s\n  want %s", fmtRecord(got), fmtRecord(want))
	}
	var d []string
	add := func(field string, g, w any) {
		d = append(d, fmt.Sprintf("  %s: got %v, want %v", field, g, w))
	}
	if got.Scope != want.Scope {
		add("Scope", got.Scope, want.Scope)
	}
	if got.Key != want.Key {
		add("Key", got.Key, want.Key)
	}
	if !bytes.Equal(got.Fingerprint, want.Fingerprint) {
		add("Fingerprint", fmtBytes(got.Fingerprint), fmtBytes(want.Fingerprint))
	}
	if got.State != want.State {
		add("State", got.State, want.State)
	}
	if got.Status != want.Status {
		add("Status", got.Status, want.Status)
	}
	if !bytes.Equal(got.Headers, want.Headers) {
		add("Headers", fmtBytes(got.Headers), fmtBytes(want.Headers))
	}
	if !bytes.Equal(got.Body, want.Body) {
		add("Body", fmtBytes(got.Body), fmtBytes(want.Body))
	}
	if got.LeaseToken != want.LeaseToken {
		add("LeaseToken", got.LeaseToken, want.LeaseToken)
	}
	if !got.LeaseExpiresAt.Equal(want.LeaseExpiresAt) {
		add("LeaseExpiresAt", got.LeaseExpiresAt, want.LeaseExpiresAt)
	}
	if !got.CreatedAt.Equal(want.CreatedAt) {
		add("CreatedAt", got.CreatedAt, want.CreatedAt)
	}
	if !got.ExpiresAt.Equal(want.ExpiresAt) {
		add("ExpiresAt", got.ExpiresAt, want.ExpiresAt)
	}
	return strings.Join(d, "\n")
}

func fmtRecord(r *driver.Record) string {
	if r == nil {
		return "<nil>"
	}
	return fmt.Sprintf("{%q %q fp=%s %s status=%d headers=%s body=%s lease=%q until %s created %s expires %s}",
		r.Scope, r.Key, fmtBytes(r.Fingerprint), r.State, r.Status, fmtBytes(r.Headers), fmtBytes(r.Body),
		r.LeaseToken, r.LeaseExpiresAt, r.CreatedAt, r.ExpiresAt)
}

func fmtBytes(b []byte) string {
	if len(b) > 64 {
		return fmt.Sprintf("%d bytes %x...", len(b), b[:32])
	}
	return fmt.Sprintf("%q", b)
}

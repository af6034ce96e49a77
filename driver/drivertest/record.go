package drivertest

import (
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

// Fingerprints of two different requests. They are raw hash bytes, not text.
const (
	fpA = "\x00\x9f\xffsha256-of-request-A\x00"
	fpB = "\x00\x9f\xffsha256-of-request-B\x00"
)

var recordScenarios = []scenario{
	{"ClaimNewKey", testClaimNewKey},
	{"SecondClaimSeesInProgress", testSecondClaimSeesInProgress},
	{"CompleteStoresResponse", testCompleteStoresResponse},
	{"WrongTokenLosesLease", testWrongTokenLosesLease},
	{"CompletedRecordIsFinal", testCompletedRecordIsFinal},
	{"ReleaseDeletes", testReleaseDeletes},
	{"ExpiredRecordIsReplaced", testExpiredRecordIsReplaced},
	{"LiveLeaseIsNeverTakenOver", testLiveLeaseIsNeverTakenOver},
	{"ExpiredLeaseTakenOverWithSameFingerprint", testExpiredLeaseTakenOver},
	{"ExpiredLeaseKeptWithOtherFingerprint", testExpiredLeaseKeptWithOtherFingerprint},
	{"ExtendLeasePreventsTakeover", testExtendLeasePreventsTakeover},
	{"GetMissingIsNotFound", testGetMissing},
	{"ScopesIsolateKeys", testScopesIsolateKeys},
	{"DeleteExpiredInBatches", testDeleteExpired},
	{"TimesKeepTheInstant", testTimesKeepTheInstant},
}

func testClaimNewKey(t *testing.T, ex driver.Executor) {
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)
	mustGet(t, ex, testScope, "key-1", inProgress(p))
}

// A retry of the same request, and a different request reusing the key, both
// see the first claim while it executes.
func testSecondClaimSeesInProgress(t *testing.T, ex driver.Executor) {
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)
	mustFindExisting(t, ex, claimAt("key-1", fpA, newToken(), t0.Add(time.Second)), inProgress(p))
	mustFindExisting(t, ex, claimAt("key-1", fpB, newToken(), t0.Add(time.Second)), inProgress(p))
	mustGet(t, ex, testScope, "key-1", inProgress(p))
}

// The stored response is replayed byte for byte, whatever it contains.
func testCompleteStoresResponse(t *testing.T, ex driver.Executor) {
	binary := make([]byte, 0, 3*256)
	for i := range 3 * 256 {
		binary = append(binary, byte(i))
	}
	large := make([]byte, 256<<10)
	_, _ = rand.Read(large)

	cases := []struct {
		name    string
		status  int
		headers []byte
		body    []byte
	}{
		{"NoBody", 204, nil, nil},
		{"EmptyBody", 200, []byte(`{}`), []byte{}},
		{"JSON", 201, []byte(`{"Content-Type":["application/json"],"Location":["/payments/pay_1"]}`),
			[]byte(`{"id":"pay_1","amount":"10.0000","note":"naïve ☃"}` + "\n")},
		{"ClientError", 422, []byte(`{"Content-Type":["application/problem+json"]}`),
			[]byte(`{"type":"about:blank","status":422}`)},
		{"Binary", 200, []byte(`{"Content-Type":["application/octet-stream"]}`), binary},
		{"InvalidUTF8", 200, []byte(`{"Content-Type":["text/plain"]}`), []byte("\xff\xfe\x00\xc3\x28 end")},
		{"Large", 200, []byte(`{"Content-Type":["application/octet-stream"]}`), large},
	}
	for _, tc := range cases {
		key := "key-" + tc.name
		p := claimAt(key, fpA, newToken(), t0)
		mustClaim(t, ex, p)
		c := completeParams(p, tc.status, tc.headers, tc.body)
		complete(t, ex, c)
		want := completed(p, c)
		mustGet(t, ex, testScope, key, want)
		// The retry gets the stored response; a different request with
		// the same key gets it too, with the original fingerprint, so the
		// caller can answer 409.
		mustFindExisting(t, ex, claimAt(key, fpA, newToken(), t0.Add(time.Minute)), want)
		mustFindExisting(t, ex, claimAt(key, fpB, newToken(), t0.Add(time.Minute)), want)
	}
}

func testWrongTokenLosesLease(t *testing.T, ex driver.Executor) {
	ctx := t.Context()
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)

	for _, tok := range []string{newToken(), ""} {
		c := completeParams(p, 200, nil, []byte("not mine"))
		c.LeaseToken = tok
		wantLeaseLost(t, "RecordComplete with token "+tok, ex.RecordComplete(ctx, c))
		wantLeaseLost(t, "RecordRelease with token "+tok, ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: testScope, Key: "key-1", LeaseToken: tok}))
		wantLeaseLost(t, "RecordExtendLease with token "+tok, ex.RecordExtendLease(ctx, &driver.RecordExtendLeaseParams{Scope: testScope, Key: "key-1", LeaseToken: tok, Until: t0.Add(time.Hour)}))
	}
	// Nothing changed: the owner still holds the key with its lease.
	mustGet(t, ex, testScope, "key-1", inProgress(p))

	// The owner's token does not reach a key or scope it did not claim.
	c := completeParams(p, 200, nil, nil)
	c.Key = "key-2"
	wantLeaseLost(t, "RecordComplete on a missing key", ex.RecordComplete(ctx, c))
	wantLeaseLost(t, "RecordRelease on a missing key", ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: testScope, Key: "key-2", LeaseToken: p.LeaseToken}))
	wantLeaseLost(t, "RecordExtendLease on a missing key", ex.RecordExtendLease(ctx, &driver.RecordExtendLeaseParams{Scope: testScope, Key: "key-2", LeaseToken: p.LeaseToken, Until: t0.Add(time.Hour)}))
	c = completeParams(p, 200, nil, nil)
	c.Scope = "tenant-2 POST /payments"
	wantLeaseLost(t, "RecordComplete in another scope", ex.RecordComplete(ctx, c))
	mustNotFind(t, ex, testScope, "key-2")
	mustNotFind(t, ex, "tenant-2 POST /payments", "key-1")

	// And the owner can still finish.
	c = completeParams(p, 200, nil, []byte("mine"))
	complete(t, ex, c)
	mustGet(t, ex, testScope, "key-1", completed(p, c))
}

// A completed record cannot be completed again, released or extended, not
// even by the token that completed it.
func testCompletedRecordIsFinal(t *testing.T, ex driver.Executor) {
	ctx := t.Context()
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)
	c := completeParams(p, 201, []byte(`{"X-Id":["1"]}`), []byte("first"))
	complete(t, ex, c)

	again := completeParams(p, 500, nil, []byte("second"))
	wantLeaseLost(t, "second RecordComplete", ex.RecordComplete(ctx, again))
	wantLeaseLost(t, "RecordRelease after complete", ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: testScope, Key: "key-1", LeaseToken: p.LeaseToken}))
	wantLeaseLost(t, "RecordExtendLease after complete", ex.RecordExtendLease(ctx, &driver.RecordExtendLeaseParams{Scope: testScope, Key: "key-1", LeaseToken: p.LeaseToken, Until: t0.Add(time.Hour)}))
	empty := completeParams(p, 500, nil, nil)
	empty.LeaseToken = "" // the cleared lease must not match an empty token
	wantLeaseLost(t, "RecordComplete with empty token", ex.RecordComplete(ctx, empty))
	wantLeaseLost(t, "RecordRelease with empty token", ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: testScope, Key: "key-1", LeaseToken: ""}))

	mustGet(t, ex, testScope, "key-1", completed(p, c))
}

// Release (a 5xx or a panic) deletes the claim so that a retry executes.
func testReleaseDeletes(t *testing.T, ex driver.Executor) {
	ctx := t.Context()
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)
	if err := ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: testScope, Key: "key-1", LeaseToken: p.LeaseToken}); err != nil {
		t.Fatalf("RecordRelease: %v", err)
	}
	mustNotFind(t, ex, testScope, "key-1")
	wantLeaseLost(t, "second RecordRelease", ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: testScope, Key: "key-1", LeaseToken: p.LeaseToken}))
	wantLeaseLost(t, "RecordComplete after release", ex.RecordComplete(ctx, completeParams(p, 200, nil, nil)))
	mustNotFind(t, ex, testScope, "key-1")

	// The retry claims the key, even with another fingerprint, well within
	// the released claim's lease.
	q := claimAt("key-1", fpB, newToken(), t0.Add(time.Second))
	mustClaim(t, ex, q)
	mustGet(t, ex, testScope, "key-1", inProgress(q))
	wantLeaseLost(t, "old token after the key was claimed again", ex.RecordComplete(ctx, completeParams(p, 200, nil, nil)))
}

// A record whose ExpiresAt is not after Now is treated as absent.
func testExpiredRecordIsReplaced(t *testing.T, ex driver.Executor) {
	ctx := t.Context()

	// A completed record deduplicates until its last microsecond...
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)
	c := completeParams(p, 200, []byte(`{"A":["1"]}`), []byte("old response"))
	complete(t, ex, c)
	mustFindExisting(t, ex, claimAt("key-1", fpB, newToken(), p.ExpiresAt.Add(-time.Microsecond)), completed(p, c))
	// ...and at ExpiresAt a new claim replaces it, another fingerprint too,
	// leaving nothing of the old response.
	q := claimAt("key-1", fpB, newToken(), p.ExpiresAt)
	mustClaim(t, ex, q)
	mustGet(t, ex, testScope, "key-1", inProgress(q))

	// An in-progress record whose owner vanished is replaced at its
	// ExpiresAt whatever the fingerprint, and its old owner lost it.
	p2 := claimAt("key-2", fpA, newToken(), t0)
	mustClaim(t, ex, p2)
	q2 := claimAt("key-2", fpB, newToken(), p2.ExpiresAt.Add(time.Hour))
	mustClaim(t, ex, q2)
	mustGet(t, ex, testScope, "key-2", inProgress(q2))
	wantLeaseLost(t, "RecordComplete by the replaced owner", ex.RecordComplete(ctx, completeParams(p2, 200, nil, nil)))
	wantLeaseLost(t, "RecordRelease by the replaced owner", ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: testScope, Key: "key-2", LeaseToken: p2.LeaseToken}))
	mustGet(t, ex, testScope, "key-2", inProgress(q2))
}

func testLiveLeaseIsNeverTakenOver(t *testing.T, ex driver.Executor) {
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)
	for _, now := range []time.Time{t0, t0.Add(time.Second), p.LeaseExpiresAt.Add(-time.Microsecond)} {
		mustFindExisting(t, ex, claimAt("key-1", fpA, newToken(), now), inProgress(p))
		mustFindExisting(t, ex, claimAt("key-1", fpB, newToken(), now), inProgress(p))
	}
	c := completeParams(p, 200, nil, []byte("owner finished"))
	complete(t, ex, c)
	mustGet(t, ex, testScope, "key-1", completed(p, c))
}

// An in-progress record whose lease is not after Now was abandoned (its
// owner crashed): the same request takes it over, and the old owner lost it.
func testExpiredLeaseTakenOver(t *testing.T, ex driver.Executor) {
	ctx := t.Context()
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)

	q := claimAt("key-1", fpA, newToken(), p.LeaseExpiresAt)
	mustClaim(t, ex, q)
	mustGet(t, ex, testScope, "key-1", inProgress(q))

	wantLeaseLost(t, "RecordComplete by the old owner", ex.RecordComplete(ctx, completeParams(p, 200, nil, []byte("late"))))
	wantLeaseLost(t, "RecordExtendLease by the old owner", ex.RecordExtendLease(ctx, &driver.RecordExtendLeaseParams{Scope: testScope, Key: "key-1", LeaseToken: p.LeaseToken, Until: t0.Add(time.Hour)}))
	wantLeaseLost(t, "RecordRelease by the old owner", ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: testScope, Key: "key-1", LeaseToken: p.LeaseToken}))
	mustGet(t, ex, testScope, "key-1", inProgress(q))

	c := completeParams(q, 201, nil, []byte("new owner"))
	complete(t, ex, c)
	mustGet(t, ex, testScope, "key-1", completed(q, c))
}

// A different request never takes over an abandoned claim of the key: it
// gets the existing record (and the caller answers 409).
func testExpiredLeaseKeptWithOtherFingerprint(t *testing.T, ex driver.Executor) {
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)
	mustFindExisting(t, ex, claimAt("key-1", fpB, newToken(), p.LeaseExpiresAt), inProgress(p))
	mustFindExisting(t, ex, claimAt("key-1", fpB, newToken(), p.LeaseExpiresAt.Add(time.Hour)), inProgress(p))
	// Nobody took it over, so the slow owner still owns it.
	c := completeParams(p, 200, nil, []byte("slow owner"))
	complete(t, ex, c)
	mustGet(t, ex, testScope, "key-1", completed(p, c))
}

func testExtendLeasePreventsTakeover(t *testing.T, ex driver.Executor) {
	ctx := t.Context()
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)
	until := t0.Add(5 * time.Minute)
	if err := ex.RecordExtendLease(ctx, &driver.RecordExtendLeaseParams{Scope: testScope, Key: "key-1", LeaseToken: p.LeaseToken, Until: until}); err != nil {
		t.Fatalf("RecordExtendLease: %v", err)
	}
	want := inProgress(p)
	want.LeaseExpiresAt = until
	mustGet(t, ex, testScope, "key-1", want)

	// Past the original lease, before the extended one: still owned.
	mustFindExisting(t, ex, claimAt("key-1", fpA, newToken(), p.LeaseExpiresAt), want)
	mustFindExisting(t, ex, claimAt("key-1", fpA, newToken(), until.Add(-time.Microsecond)), want)
	// At the extended lease's end it is abandoned.
	q := claimAt("key-1", fpA, newToken(), until)
	mustClaim(t, ex, q)
	mustGet(t, ex, testScope, "key-1", inProgress(q))
}

func testGetMissing(t *testing.T, ex driver.Executor) {
	mustNotFind(t, ex, testScope, "key-1")
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)
	mustNotFind(t, ex, testScope, "key-2")
	mustNotFind(t, ex, "tenant-2 POST /payments", "key-1")
	mustNotFind(t, ex, "", "key-1")
}

// The same key in two scopes is two records: one client can neither see nor
// touch another client's record.
func testScopesIsolateKeys(t *testing.T, ex driver.Executor) {
	ctx := t.Context()
	a := claimAt("key-1", fpA, newToken(), t0)
	a.Scope = "tenant-a POST /payments"
	b := claimAt("key-1", fpB, newToken(), t0)
	b.Scope = "tenant-b POST /payments"
	mustClaim(t, ex, a)
	mustClaim(t, ex, b)

	wantLeaseLost(t, "b's token on a's record", ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: a.Scope, Key: "key-1", LeaseToken: b.LeaseToken}))
	ca := completeParams(a, 201, nil, []byte("a's payment"))
	complete(t, ex, ca)
	mustGet(t, ex, a.Scope, "key-1", completed(a, ca))
	mustGet(t, ex, b.Scope, "key-1", inProgress(b))

	if err := ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: b.Scope, Key: "key-1", LeaseToken: b.LeaseToken}); err != nil {
		t.Fatalf("RecordRelease(b): %v", err)
	}
	mustNotFind(t, ex, b.Scope, "key-1")
	mustGet(t, ex, a.Scope, "key-1", completed(a, ca))

	// Scope and key are separate columns, not one joined string.
	x := claimAt("b:c", fpA, newToken(), t0)
	x.Scope = "a"
	y := claimAt("c", fpB, newToken(), t0)
	y.Scope = "a:b"
	mustClaim(t, ex, x)
	mustClaim(t, ex, y)
	mustGet(t, ex, "a", "b:c", inProgress(x))
	mustGet(t, ex, "a:b", "c", inProgress(y))
}

// RecordDeleteExpired deletes exactly the records whose ExpiresAt is not
// after now, at most limit per call.
func testDeleteExpired(t *testing.T, ex driver.Executor) {
	ctx := t.Context()
	now := t0.Add(48 * time.Hour)
	expiries := map[string]time.Time{
		"expired-1": t0.Add(time.Hour),
		"expired-2": t0.Add(2 * time.Hour),
		"expired-3": t0.Add(24 * time.Hour),
		"expired-4": t0.Add(30 * time.Hour),
		"expired-5": now.Add(-time.Hour),
		"expired-6": now.Add(-time.Microsecond),
		"expired-7": now, // not after now: expired
		"live-1":    now.Add(time.Microsecond),
		"live-2":    now.Add(time.Hour),
		"live-3":    now.Add(72 * time.Hour),
	}
	const expired = 7
	want := map[string]*driver.Record{}
	i := 0
	for key, exp := range expiries {
		p := claimAt(key, fpA, newToken(), t0)
		p.ExpiresAt = exp
		mustClaim(t, ex, p)
		want[key] = inProgress(p)
		if i%2 == 0 { // completed and in-progress records expire alike
			c := completeParams(p, 200, nil, []byte(key))
			complete(t, ex, c)
			want[key] = completed(p, c)
		}
		i++
	}

	// Expired records stay readable until cleanup removes them.
	mustGet(t, ex, testScope, "expired-1", want["expired-1"])

	for _, bad := range []int{0, -1} {
		if res, err := ex.RecordDeleteExpired(ctx, &driver.RecordDeleteExpiredParams{Now: now, Limit: bad}); err == nil {
			t.Fatalf("RecordDeleteExpired with Limit %d = %d, nil; want an error", bad, res.Deleted)
		}
	}

	const limit = 3
	remaining := expired
	for call := 1; remaining > 0; call++ {
		if call > expired {
			t.Fatalf("%d expired records left after %d calls", remaining, call-1)
		}
		res, err := ex.RecordDeleteExpired(ctx, &driver.RecordDeleteExpiredParams{Now: now, Limit: limit})
		if err != nil {
			t.Fatalf("RecordDeleteExpired call %d: %v", call, err)
		}
		if wantN := min(limit, remaining); res.Deleted != wantN {
			t.Fatalf("RecordDeleteExpired call %d with %d expired left, limit %d: deleted %d, want %d", call, remaining, limit, res.Deleted, wantN)
		}
		remaining -= res.Deleted
	}
	res, err := ex.RecordDeleteExpired(ctx, &driver.RecordDeleteExpiredParams{Now: now, Limit: limit})
	if err != nil || res.Deleted != 0 {
		t.Fatalf("RecordDeleteExpired with nothing expired = %d, %v; want 0, nil", res.Deleted, err)
	}

	for key, rec := range want {
		if strings.HasPrefix(key, "live") {
			mustGet(t, ex, testScope, key, rec)
		} else {
			mustNotFind(t, ex, testScope, key)
		}
	}
	if t.Failed() {
		return
	}

	// A live record expires later and is deleted then.
	res, err = ex.RecordDeleteExpired(ctx, &driver.RecordDeleteExpiredParams{Now: now.Add(time.Microsecond), Limit: 100})
	if err != nil || res.Deleted != 1 {
		t.Fatalf("RecordDeleteExpired at now+1µs = %d, %v; want 1 (live-1), nil", res.Deleted, err)
	}
	mustNotFind(t, ex, testScope, "live-1")
	if _, err := ex.RecordGet(ctx, &driver.RecordGetParams{Scope: testScope, Key: "live-2"}); err != nil {
		t.Fatalf("live-2 deleted too early: %v", err)
	}
}

// Times with nanoseconds come back as the same instant to the microsecond.
func testTimesKeepTheInstant(t *testing.T, ex driver.Executor) {
	now := time.Date(2031, 7, 1, 23, 59, 59, 999_999_999, time.FixedZone("UTC-09:30", -(9*3600+1800)))
	p := claimAt("key-1", fpA, newToken(), now)
	mustClaim(t, ex, p)
	got, err := ex.RecordGet(t.Context(), &driver.RecordGetParams{Scope: testScope, Key: "key-1"})
	if err != nil {
		t.Fatalf("RecordGet: %v", err)
	}
	for _, tc := range []struct {
		name      string
		got, want time.Time
	}{
		{"CreatedAt", got.CreatedAt, p.Now},
		{"ExpiresAt", got.ExpiresAt, p.ExpiresAt},
		{"LeaseExpiresAt", got.LeaseExpiresAt, p.LeaseExpiresAt},
	} {
		if d := tc.got.Sub(tc.want).Abs(); d >= time.Microsecond {
			t.Errorf("%s = %s, want %s to the microsecond (off by %s)", tc.name, tc.got, tc.want, d)
		}
	}
}

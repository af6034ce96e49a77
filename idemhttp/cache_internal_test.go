package idemhttp

import (
	"bytes"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

var cacheT0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func cacheRec(body string, expires time.Time) *driver.Record {
	return &driver.Record{
		Fingerprint: bytes.Repeat([]byte{7}, 32), State: driver.StateCompleted,
		Status: 201, Headers: []byte(`{"Content-Type":["application/json"]}`), Body: []byte(body),
		CreatedAt: expires.Add(-24 * time.Hour), ExpiresAt: expires,
	}
}

func clockAt(t time.Time) func() time.Time { return func() time.Time { return t } }

// checkAccounting verifies every shard's byte count against its entries and
// the whole against the budget.
func checkAccounting(t *testing.T, c *replayCache) {
	t.Helper()
	var total int64
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		var sum int64
		n := 0
		for e := s.lru.next; e != &s.lru; e = e.next {
			if s.m[e.k] != e {
				t.Errorf("shard %d: list entry %v not in the map", i, e.k)
			}
			if n := entrySize(e.k.scope, e.k.key, e.rec, e.hdr); e.size != n {
				t.Errorf("shard %d: entry %v accounted %d, is %d", i, e.k, e.size, n)
			}
			sum += e.size
			n++
		}
		if n != len(s.m) || sum != s.bytes {
			t.Errorf("shard %d: list %d entries %d bytes; map %d entries, accounted %d bytes", i, n, sum, len(s.m), s.bytes)
		}
		if s.bytes > c.shardMax {
			t.Errorf("shard %d: %d bytes over its budget %d", i, s.bytes, c.shardMax)
		}
		total += s.bytes
		s.mu.Unlock()
	}
	if total > c.maxBytes {
		t.Errorf("cache holds %d bytes, budget %d", total, c.maxBytes)
	}
}

func TestReplayCacheDisabled(t *testing.T) {
	for _, n := range []int64{0, NoReplayCache, -5} {
		if c := newReplayCache(n); c != nil {
			t.Errorf("newReplayCache(%d) is not nil", n)
		}
	}
	if got := (Config{}).withDefaults().ReplayCacheBytes; got != DefaultReplayCacheBytes {
		t.Errorf("default ReplayCacheBytes = %d, want %d", got, DefaultReplayCacheBytes)
	}
	if got := (Config{ReplayCacheBytes: NoReplayCache}).withDefaults().ReplayCacheBytes; got != NoReplayCache {
		t.Errorf("NoReplayCache became %d", got)
	}
}

func TestReplayCachePutGet(t *testing.T) {
	c := newReplayCache(1 << 20)
	exp := cacheT0.Add(24 * time.Hour)
	src := cacheRec(`{"id":1}`, exp)
	c.put("s", "k", src, cacheT0)
	// The cache holds a copy: the caller may reuse its buffers.
	src.Body[2] = 'X'
	src.Headers[0] = 'X'
	src.Fingerprint[0] = 0
	e := c.get("s", "k", clockAt(cacheT0))
	if e == nil {
		t.Fatal("miss")
	}
	got := e.rec
	if string(got.Body) != `{"id":1}` || got.Fingerprint[0] != 7 ||
		got.Status != 201 || got.State != driver.StateCompleted || !got.ExpiresAt.Equal(exp) {
		t.Fatalf("get = %+v", got)
	}
	// The headers are decoded once, and every request gets its own copy.
	h := http.Header{"Content-Type": {"text/plain"}}
	e.addHeaders(h)
	h2 := make(http.Header)
	e.addHeaders(h2)
	h2["Content-Type"][0] = "changed"
	if strings.Join(h.Values("Content-Type"), ",") != "application/json" { // replaced, as the executed response did
		t.Fatalf("headers = %v", h)
	}
	h3 := make(http.Header)
	e.addHeaders(h3)
	if h3.Get("Content-Type") != "application/json" {
		t.Fatalf("a request's header change reached the cache: %v", h3)
	}
	if c.get("s", "other", clockAt(cacheT0)) != nil || c.get("other", "k", clockAt(cacheT0)) != nil {
		t.Fatal("a lookup with another scope or key hit")
	}
	// The scope is part of the key: another scope's record is its own entry.
	c.put("s2", "k", cacheRec(`{"id":2}`, exp), cacheT0)
	if r := c.get("s2", "k", clockAt(cacheT0)); r == nil || string(r.rec.Body) != `{"id":2}` {
		t.Fatalf("s2/k = %+v", r)
	}
	if r := c.get("s", "k", clockAt(cacheT0)); r == nil || string(r.rec.Body) != `{"id":1}` {
		t.Fatalf("s/k = %+v", r)
	}
	// A record whose headers cannot be decoded is not cached (a replay
	// from the store logs them).
	bad := cacheRec("x", exp)
	bad.Headers = []byte("{not json")
	c.put("s", "bad", bad, cacheT0)
	st := c.stats()
	if st.Hits != 3 || st.Misses != 2 || st.Entries != 2 || st.MaxBytes != 1<<20 {
		t.Fatalf("stats = %+v", st)
	}
	checkAccounting(t, c)
}

func TestReplayCacheExpiry(t *testing.T) {
	c := newReplayCache(1 << 20)
	exp := cacheT0.Add(time.Hour)
	c.put("s", "k", cacheRec("b", exp), cacheT0)
	if c.get("s", "k", clockAt(exp.Add(-time.Nanosecond))) == nil {
		t.Fatal("entry not served before its expiry")
	}
	// At ExpiresAt the record is expired (as in the store): dropped.
	if c.get("s", "k", clockAt(exp)) != nil {
		t.Fatal("entry served at its expiry")
	}
	if st := c.stats(); st.Entries != 0 || st.Bytes != 0 {
		t.Fatalf("expired entry not dropped: %+v", st)
	}
	// Even a clock going back does not revive it.
	if c.get("s", "k", clockAt(cacheT0)) != nil {
		t.Fatal("dropped entry served")
	}
	// An expired record is not cached at all.
	c.put("s", "k", cacheRec("b", exp), exp)
	c.put("s", "k", cacheRec("b", exp), exp.Add(time.Second))
	if st := c.stats(); st.Entries != 0 {
		t.Fatalf("expired record cached: %+v", st)
	}
	// Only a newer record (later expiry) replaces an entry.
	c.put("s", "k", cacheRec("old", exp), cacheT0)
	c.put("s", "k", cacheRec("new", exp.Add(time.Hour)), cacheT0)
	c.put("s", "k", cacheRec("old", exp), cacheT0)
	if r := c.get("s", "k", clockAt(cacheT0)); r == nil || string(r.rec.Body) != "new" {
		t.Fatalf("got %+v, want the newer record", r)
	}
	if st := c.stats(); st.Entries != 1 {
		t.Fatalf("stats = %+v", st)
	}
	checkAccounting(t, c)
}

func TestReplayCacheSkipsLargeEntries(t *testing.T) {
	const budget = 1 << 20
	c := newReplayCache(budget)
	exp := cacheT0.Add(time.Hour)
	hdr := []cachedHeader{{"Content-Type", []string{"application/json"}}}
	base := entrySize("s", "fits", cacheRec("", exp), hdr)
	fits := strings.Repeat("x", int(budget/cacheMaxEntryDivisor-base))
	c.put("s", "fits", cacheRec(fits, exp), cacheT0)
	c.put("s", "large", cacheRec(fits+"x", exp), cacheT0)
	if c.get("s", "fits", clockAt(cacheT0)) == nil {
		t.Fatal("entry within 1/128 of the budget not cached")
	}
	if c.get("s", "large", clockAt(cacheT0)) != nil {
		t.Fatal("entry over 1/128 of the budget cached")
	}
	checkAccounting(t, c)
}

// TestReplayCacheBound floods 20,000 distinct keys with 1 KiB bodies into a
// 1 MiB cache: the accounted bytes never exceed the budget, the least
// recently used entries go, and a key read all along stays.
func TestReplayCacheBound(t *testing.T) {
	const budget = 1 << 20
	c := newReplayCache(budget)
	exp := cacheT0.Add(24 * time.Hour)
	body := strings.Repeat("b", 1024)
	c.put("s", "hot", cacheRec(body, exp), cacheT0)
	for i := range 20000 {
		c.put("s", fmt.Sprintf("key-%05d", i), cacheRec(body, exp), cacheT0)
		if c.get("s", "hot", clockAt(cacheT0)) == nil {
			t.Fatalf("recently used key evicted after %d puts", i)
		}
		if i%1000 == 0 {
			if st := c.stats(); st.Bytes > budget {
				t.Fatalf("after %d puts: %d bytes > budget %d", i, st.Bytes, budget)
			}
			checkAccounting(t, c)
		}
	}
	st := c.stats()
	size := entrySize("s", "key-00000", cacheRec(body, exp), []cachedHeader{{"Content-Type", []string{"application/json"}}})
	if st.Bytes > budget || st.Entries < int(budget/size)*3/4 || st.Evictions == 0 {
		t.Fatalf("stats = %+v (entry %d bytes): want under the budget, mostly full, with evictions", st, size)
	}
	if c.get("s", "key-00000", clockAt(cacheT0)) != nil {
		t.Fatal("the oldest key survived the flood")
	}
	if c.get("s", "key-19999", clockAt(cacheT0)) == nil {
		t.Fatal("the newest key was evicted")
	}
	checkAccounting(t, c)
	t.Logf("%+v, %d bytes per entry", st, size)
}

// TestReplayCacheConcurrent hammers a small cache from 16 goroutines (run it
// with -race): the accounting stays exact and within the budget.
func TestReplayCacheConcurrent(t *testing.T) {
	const budget = 256 << 10
	c := newReplayCache(budget)
	exp := cacheT0.Add(time.Hour)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 3000 {
				key := fmt.Sprintf("k%d", (i*7+g)%500)
				body := strings.Repeat("x", (i+g)%1500)
				switch i % 3 {
				case 0:
					c.put("s", key, cacheRec(body, exp.Add(time.Duration(i%5)*time.Minute)), cacheT0)
				case 1:
					if r := c.get("s", key, clockAt(cacheT0)); r != nil && r.rec.State != driver.StateCompleted {
						t.Errorf("got state %q", r.rec.State)
					}
				default:
					_ = c.get("s", key, clockAt(exp.Add(time.Duration(i%7)*time.Minute)))
				}
			}
		})
	}
	wg.Wait()
	checkAccounting(t, c)
	if st := c.stats(); st.Bytes > budget {
		t.Fatalf("stats = %+v", st)
	}
}

// TestReplayCacheHeapWithinBudget floods a cache of 4 MiB with 30,000
// distinct keys of small responses (where the per-entry overhead weighs
// most): what the cache keeps alive on the heap, measured after a GC,
// stays within 1.5 times ReplayCacheBytes, not a multiple of it. Not
// parallel: it reads the process's heap.
func TestReplayCacheHeapWithinBudget(t *testing.T) {
	const budget = 4 << 20
	hdr := []byte(`{"Content-Type":["application/json"],"Location":["/v1/payments/0123456789"]}`)
	for _, size := range []int{0, 64, 4096} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			c := newReplayCache(budget)
			exp := cacheT0.Add(24 * time.Hour)
			for i := range 30000 {
				// A scope and key of their own per entry, as requests
				// bring them.
				scope := fmt.Sprintf("principal-%04d POST /v1/payments", i%1000)
				key := fmt.Sprintf("%08d-0000-4000-8000-000000000000", i)
				rec := cacheRec("", exp)
				rec.Headers, rec.Body = hdr, make([]byte, size)
				c.put(scope, key, rec, cacheT0)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			st := c.stats()
			t.Logf("%d entries, %d KiB accounted, heap %+d KiB (%.2f of the budget)", st.Entries, st.Bytes>>10, grown>>10, float64(grown)/budget)
			if st.Bytes > budget || st.Evictions == 0 {
				t.Errorf("stats = %+v: want within the budget, with evictions", st)
			}
			if grown > budget*3/2 {
				t.Errorf("the cache keeps %d KiB on the heap, over 1.5 times its %d KiB budget", grown>>10, budget>>10)
			}
			runtime.KeepAlive(c)
		})
	}
}

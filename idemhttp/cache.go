package idemhttp

import (
	"bytes"
	"hash/maphash"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem/driver"
)

// DefaultReplayCacheBytes is the replay cache's budget when
// Config.ReplayCacheBytes is zero.
const DefaultReplayCacheBytes int64 = 32 << 20

// NoReplayCache as Config.ReplayCacheBytes disables the replay cache: every
// retry reads its record from the store.
const NoReplayCache int64 = -1

// Replay cache layout. The budget is split evenly between cacheShards
// shards, each with its own mutex and LRU list, so concurrent requests
// rarely wait for each other. An entry is accounted as its body, headers,
// fingerprint, key and scope plus cacheEntryOverhead (the entry, the
// record, the map slot, the header slices); one larger than
// 1/cacheMaxEntryDivisor of the budget (256 KiB at the default) is not
// cached, so a shard always holds several entries and a large response
// does not push out many small ones.
const (
	cacheShards          = 16
	cacheEntryOverhead   = 512
	cacheMaxEntryDivisor = 128
)

// CacheStats are the counters of a Middleware's replay cache.
type CacheStats struct {
	// Hits are requests answered from memory (a replay or a mismatch).
	Hits uint64
	// Misses are lookups that found no live entry; the request went to the
	// store as without a cache.
	Misses uint64
	// Evictions are entries dropped to stay within the budget.
	Evictions uint64
	// Entries and Bytes are what the cache holds now; Bytes never exceeds
	// MaxBytes.
	Entries  int
	Bytes    int64
	MaxBytes int64
}

// CacheStats returns the replay cache's counters (all zero when it is
// disabled).
func (m *Middleware[TTx]) CacheStats() CacheStats {
	if m.cache == nil {
		return CacheStats{}
	}
	return m.cache.stats()
}

// answerCached answers cmd from the replay cache: a replay when the cached
// record has cmd's fingerprint, the mismatch answer otherwise. It returns
// false on a miss, and the request goes to the store exactly as without a
// cache.
func (m *Middleware[TTx]) answerCached(cmd *command) bool {
	if m.cache == nil {
		return false
	}
	e := m.cache.get(cmd.scope, cmd.key, m.cfg.Now)
	if e == nil {
		return false
	}
	if !bytes.Equal(e.rec.Fingerprint, cmd.fingerprint) {
		// The mismatch answer. Not through answerExisting: it would put
		// e.rec back, whose headers live in e.hdr, and, were the entry
		// evicted meanwhile, cache a record without its headers.
		m.mismatch(cmd)
		return true
	}
	// What replay writes, with the headers decoded once, when cached. The
	// length is known: the body never goes out chunked.
	span := m.span(cmd, "idem.http.replay")
	defer span.End()
	h := cmd.w.Header()
	if len(e.rec.Body) > 0 && !e.trailers { // trailers follow a chunked body
		h.Set("Content-Length", strconv.Itoa(len(e.rec.Body)))
	}
	e.addHeaders(h)
	h.Set(ReplayedHeader, "true")
	cmd.w.WriteHeader(e.rec.Status)
	_, _ = cmd.w.Write(e.rec.Body)
	m.reportCmd(cmd, OutcomeReplayed)
	return true
}

// remember caches rec, a live record of cmd's key read from the store (or
// just committed), if it is completed.
func (m *Middleware[TTx]) remember(cmd *command, rec *driver.Record) {
	if m.cache == nil || rec == nil || rec.State != driver.StateCompleted {
		return
	}
	m.cache.put(cmd.scope, cmd.key, rec, m.cfg.Now())
}

// rememberCompleted caches the response that complete stored for cmd. It
// is called once that record is committed: after COMMIT in ModeTx. The
// entry expires at cmd.started+TTL, to the second (cachedExpiry), no later
// than the stored record (its expiry was computed from a later clock
// reading).
func (m *Middleware[TTx]) rememberCompleted(cmd *command) {
	p := cmd.completed
	if m.cache == nil || p == nil {
		return
	}
	m.cache.put(cmd.scope, cmd.key, &driver.Record{
		Scope: cmd.scope, Key: cmd.key, Fingerprint: cmd.fingerprint, State: driver.StateCompleted,
		Status: p.Status, Headers: p.Headers, Body: p.Body,
		CreatedAt: cmd.started, ExpiresAt: cachedExpiry(cmd.started.Add(m.cfg.TTL)),
	}, m.cfg.Now())
}

// cachedExpiry is the expiry of an entry filled at commit whose record was
// stored to expire at exp: exp truncated to the second. A store keeps its
// times to some precision (PostgreSQL and sqlitedriver to the microsecond,
// others to the millisecond or second, rounding or truncating), and the
// record expires there as stored: an entry expiring at exp to the
// nanosecond would outlive it, and its instance would replay the old
// response while the others, finding the record expired, execute again.
// Entries filled from a store read have the stored expiry already.
func cachedExpiry(exp time.Time) time.Time { return exp.Truncate(time.Second) }

// replayCache holds completed records by (scope, key), bounded in bytes. A
// completed record never changes until it expires, so an entry stays valid
// on every instance without invalidation; it is dropped when read at or
// after its ExpiresAt.
type replayCache struct {
	seed     maphash.Seed
	maxBytes int64 // the whole budget
	shardMax int64 // the budget of one shard
	maxEntry int64 // larger entries are not cached
	shards   [cacheShards]cacheShard
}

type cacheKey struct{ scope, key string }

// cacheEntry is one record in a shard's map and LRU list. rec and hdr are
// never modified once the entry is made.
type cacheEntry struct {
	k cacheKey
	// rec is the record without its Headers: they are in hdr, decoded.
	rec        *driver.Record
	hdr        []cachedHeader
	nvals      int  // values in hdr
	trailers   bool // hdr has trailers (isTrailerKey)
	size       int64
	prev, next *cacheEntry
}

// cachedHeader is one stored header, its name canonical.
type cachedHeader struct {
	name   string
	values []string
}

// addHeaders sets e's headers in h, replacing what h had under their names,
// as decodeHeaders does with the stored ones.
// h gets copies of the values (one allocation): it belongs to the request.
func (e *cacheEntry) addHeaders(h http.Header) {
	if e.nvals == 0 {
		return
	}
	vals := make([]string, e.nvals)
	i := 0
	for _, ch := range e.hdr {
		j := i + copy(vals[i:], ch.values)
		if ch.name == varyHeader {
			h[ch.name] = addVary(h, vals[i:j:j]) // added to, as decodeHeaders does
		} else {
			h[ch.name] = vals[i:j:j] // replaced, as decodeHeaders does
		}
		i = j
	}
}

type cacheShard struct {
	mu        sync.Mutex
	m         map[cacheKey]*cacheEntry
	lru       cacheEntry // sentinel: lru.next is the most recently used
	bytes     int64
	hits      uint64
	misses    uint64
	evictions uint64
	_         [64]byte // keeps neighbouring shards' locks off one cache line
}

// newReplayCache returns a cache of maxBytes, or nil (disabled) when
// maxBytes is not positive.
func newReplayCache(maxBytes int64) *replayCache {
	if maxBytes <= 0 {
		return nil
	}
	c := &replayCache{
		seed:     maphash.MakeSeed(),
		maxBytes: maxBytes,
		shardMax: maxBytes / cacheShards,
		maxEntry: maxBytes / cacheMaxEntryDivisor,
	}
	for i := range c.shards {
		s := &c.shards[i]
		s.m = make(map[cacheKey]*cacheEntry)
		s.lru.next, s.lru.prev = &s.lru, &s.lru
	}
	return c
}

func (c *replayCache) shard(key string) *cacheShard {
	return &c.shards[maphash.String(c.seed, key)%cacheShards]
}

// entrySize is what an entry is accounted: its bytes and a fixed overhead,
// plus a string or slice header per header name and value.
func entrySize(scope, key string, rec *driver.Record, hdr []cachedHeader) int64 {
	n := len(scope) + len(key) + len(rec.Fingerprint) + len(rec.Body) + cacheEntryOverhead
	for _, ch := range hdr {
		n += len(ch.name) + 40
		for _, v := range ch.values {
			n += len(v) + 16
		}
	}
	return int64(n)
}

// get returns the live entry of (scope, key), or nil. An entry whose
// record's ExpiresAt is not after now() is dropped, never returned. now is
// only called when there is an entry.
func (c *replayCache) get(scope, key string, now func() time.Time) *cacheEntry {
	s := c.shard(key)
	s.mu.Lock()
	e := s.m[cacheKey{scope, key}]
	if e == nil {
		s.misses++
		s.mu.Unlock()
		return nil
	}
	if !e.rec.ExpiresAt.After(now()) {
		s.remove(e)
		s.misses++
		s.mu.Unlock()
		return nil
	}
	s.unlink(e)
	s.pushFront(e)
	s.hits++
	s.mu.Unlock()
	return e
}

// put caches a copy of rec, a completed record, under (scope, key), unless
// it has expired at now, is too large or has unreadable headers (a replay
// from the store logs them). An entry with the same or a later expiry (the
// same record, or a newer one) is kept instead.
func (c *replayCache) put(scope, key string, rec *driver.Record, now time.Time) {
	if !rec.ExpiresAt.After(now) {
		return
	}
	k := cacheKey{scope, key}
	s := c.shard(key)
	if s.touch(k, rec.ExpiresAt) {
		return
	}
	h := make(http.Header)
	if err := decodeHeaders(rec.Headers, h); err != nil {
		return
	}
	e := &cacheEntry{k: k, hdr: make([]cachedHeader, 0, len(h))}
	for name, vs := range h {
		e.hdr = append(e.hdr, cachedHeader{name, vs})
		e.nvals += len(vs)
		e.trailers = e.trailers || isTrailerKey(name)
	}
	e.size = entrySize(scope, key, rec, e.hdr)
	if e.size > c.maxEntry || e.size > c.shardMax {
		return
	}
	e.rec = copyRecord(scope, key, rec) // the cache's own: the caller's buffers may be reused

	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.m[k]; old != nil {
		if !old.rec.ExpiresAt.Before(rec.ExpiresAt) {
			return // a concurrent put won
		}
		s.remove(old)
	}
	for s.bytes+e.size > c.shardMax {
		s.remove(s.lru.prev) // the least recently used
		s.evictions++
	}
	s.m[k] = e
	s.pushFront(e)
	s.bytes += e.size
}

// touch marks the entry of k used and returns true if it holds a record
// expiring at or after expires (the same record or a newer one).
func (s *cacheShard) touch(k cacheKey, expires time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil || e.rec.ExpiresAt.Before(expires) {
		return false
	}
	s.unlink(e)
	s.pushFront(e)
	return true
}

// copyRecord copies what a replay needs from rec but its headers, its byte
// slices in one allocation.
func copyRecord(scope, key string, rec *driver.Record) *driver.Record {
	buf := make([]byte, len(rec.Fingerprint)+len(rec.Body))
	n := copy(buf, rec.Fingerprint)
	copy(buf[n:], rec.Body)
	return &driver.Record{
		Scope:       scope,
		Key:         key,
		Fingerprint: buf[:n:n],
		State:       driver.StateCompleted,
		Status:      rec.Status,
		Body:        buf[n:],
		CreatedAt:   rec.CreatedAt,
		ExpiresAt:   rec.ExpiresAt,
	}
}

func (c *replayCache) stats() CacheStats {
	st := CacheStats{MaxBytes: c.maxBytes}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		st.Hits += s.hits
		st.Misses += s.misses
		st.Evictions += s.evictions
		st.Entries += len(s.m)
		st.Bytes += s.bytes
		s.mu.Unlock()
	}
	return st
}

// remove drops e from the shard. The caller holds s.mu.
func (s *cacheShard) remove(e *cacheEntry) {
	s.unlink(e)
	delete(s.m, e.k)
	s.bytes -= e.size
}

func (s *cacheShard) unlink(e *cacheEntry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}

func (s *cacheShard) pushFront(e *cacheEntry) {
	e.prev = &s.lru
	e.next = s.lru.next
	s.lru.next.prev = e
	s.lru.next = e
}

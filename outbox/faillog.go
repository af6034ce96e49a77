package outbox

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"
)

// failureLogInterval is how often a publish failure that keeps repeating is
// logged again: its first round is logged at once, the rounds that repeat
// it within the interval are only counted, and the count is logged with the
// next repeat after the interval (a destination that keeps failing while
// other keys flow fails round after round, many times a second).
const failureLogInterval = 30 * time.Second

// failureQuietAfter is how long a publish failure may go unseen before the
// relay forgets it (and logs so): longer than DefaultBackoff's longest wait,
// so a failure whose events are still backing off is not forgotten. Its
// events were published by another relay, failed with another error, were
// parked, or were removed by hand.
const failureQuietAfter = 5 * time.Minute

// maxFailureGroups bounds the publish failures tracked at once; when more
// are, the one that failed least recently is forgotten (and logged again
// at its next failure).
const maxFailureGroups = 32

// failureLog limits the log lines of publish failures that repeat. A
// failure is grouped by its error text, as stored with the events
// (last_error), with every run of digits made equal: the text names the
// destination and the cause (idemkafka: "produce to TOPIC:
// TOPIC_AUTHORIZATION_FAILED ..."), so two topics failing are two
// failures, while addresses, ports and counts that change from one attempt
// to the next (a dial's local port) do not make a new one. It is safe for
// concurrent rounds.
//
// The relay also limits with it the lines of its storage failures: the
// rounds of Run that fail in the database, grouped the same way, and the
// lag queries that fail, with anyText set.
type failureLog struct {
	// anyText makes every failure one, whatever its text (the first
	// text is the group's).
	anyText bool

	// size is len(groups), read without mu (endedQuiet).
	size atomic.Int32

	mu     sync.Mutex
	groups map[string]*failureGroup
	// succeeded counts the successes endedQuiet saw while a failure was
	// tracked (rounds that went through between failed ones).
	succeeded int
}

// failureGroup is one publish failure that repeats.
type failureGroup struct {
	err         string    // the stored error text of its first round
	first, last time.Time // its first and last failed rounds
	logged      time.Time // its last line
	rounds      int       // failed rounds since first
	suppressed  int       // failed rounds not logged since logged
	succeeded   int       // successes meanwhile (failureLog.succeeded)
}

// failureClass is the key that groups a stored error text: the text with
// every UUID (an event ID, in "mark event ID failed") and every run of
// digits replaced by "0".
func failureClass(stored string) string {
	var b strings.Builder
	digits := false
	for i := 0; i < len(stored); {
		if i+36 <= len(stored) && isUUID(stored[i:i+36]) {
			if !digits {
				b.WriteByte('0')
			}
			digits = true
			i += 36
			continue
		}
		c, size := utf8.DecodeRuneInString(stored[i:])
		i += size
		if unicode.IsDigit(c) {
			if !digits {
				b.WriteByte('0')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(c)
	}
	return b.String()
}

// isUUID reports whether s is a UUID in its canonical text form.
func isUUID(s string) bool {
	for i := range 36 {
		switch c := s[i]; {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
		default:
			return false
		}
	}
	return true
}

// failed records a failed round of the failure of stored error text
// stored, at now. It returns whether to log it and, if so, the group as it
// was logged (rounds == 1 for a first failure, else a summary of
// suppressed repeats).
func (l *failureLog) failed(stored string, now time.Time) (bool, failureGroup) {
	key := ""
	if !l.anyText {
		key = failureClass(stored)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.groups[key]
	if g == nil {
		if l.groups == nil {
			l.groups = map[string]*failureGroup{}
		}
		if len(l.groups) >= maxFailureGroups {
			oldest := ""
			for k, o := range l.groups {
				if oldest == "" || o.last.Before(l.groups[oldest].last) {
					oldest = k
				}
			}
			delete(l.groups, oldest)
		}
		g = &failureGroup{err: stored, first: now, last: now, logged: now, rounds: 1}
		l.groups[key] = g
		l.size.Store(int32(len(l.groups)))
		return true, *g
	}
	g.rounds++
	if now.After(g.last) {
		g.last = now
	}
	if now.Sub(g.logged) < failureLogInterval {
		g.suppressed++
		return false, failureGroup{}
	}
	out := *g
	out.succeeded = l.succeeded
	g.logged, g.suppressed = now, 0
	return true, out
}

// published returns the failures of which an event was published (stored:
// the last_error of the events published after a failed attempt), unless
// the round failed with them again (failedNow, keys of failureClass), and
// forgets them.
func (l *failureLog) published(stored []string, failedNow map[string]bool) []failureGroup {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ended []failureGroup
	for _, s := range stored {
		if len(l.groups) == 0 {
			break
		}
		key := failureClass(s)
		if g := l.groups[key]; g != nil && !failedNow[key] {
			ended = append(ended, *g)
			delete(l.groups, key)
		}
	}
	l.size.Store(int32(len(l.groups)))
	return ended
}

// quiet returns the failures not seen for failureQuietAfter at now, and
// forgets them.
func (l *failureLog) quiet(now time.Time) []failureGroup {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ended []failureGroup
	for key, g := range l.groups {
		if now.Sub(g.last) >= failureQuietAfter {
			ended = append(ended, *g)
			delete(l.groups, key)
		}
	}
	l.size.Store(int32(len(l.groups)))
	return ended
}

// ended returns the failures as one, and forgets them: the rounds of all,
// from the first one's first round, with the error text of the one that
// failed last. It is for failures that end together (the database is
// back); ok is false if there was none.
func (l *failureLog) ended() (g failureGroup, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.endedLocked()
}

// endedQuiet records a success at now and is ended once no failure came
// for quiet (flaplog.Quiet): a failure that comes and goes (a database
// short of connections fails some rounds and not others) is one, not one
// per flip. Before, it counts the success (succeeded). Without a failure
// tracked, it costs an atomic load.
func (l *failureLog) endedQuiet(now time.Time, quiet time.Duration) (g failureGroup, ok bool) {
	if l.size.Load() == 0 {
		return g, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.groups) == 0 {
		return g, false
	}
	for _, f := range l.groups {
		if now.Sub(f.last) < quiet {
			l.succeeded++
			return g, false
		}
	}
	l.succeeded++
	return l.endedLocked()
}

// endedLocked is ended with l.mu held.
func (l *failureLog) endedLocked() (g failureGroup, ok bool) {
	g.succeeded = l.succeeded
	l.succeeded = 0
	for key, f := range l.groups {
		if !ok || f.last.After(g.last) {
			g.err, g.last = f.err, f.last
		}
		if !ok || f.first.Before(g.first) {
			g.first = f.first
		}
		g.rounds += f.rounds
		ok = true
		delete(l.groups, key)
	}
	l.size.Store(0)
	return g, ok
}

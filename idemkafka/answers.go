package idemkafka

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kgo retries a record whose partition the broker answers with a retriable
// error (NOT_ENOUGH_REPLICAS, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT,
// ...) until it is written, and tells that answer to no hook and no
// promise: the record's error, when a Publish gives up waiting for it, was
// ErrOutcomeUnknown (or the context's end, for records that carry it), and
// the events' last_error named the context or a guess from the cluster's
// metadata (see diagnose.go), not the broker's reason. The one place kgo
// says it is its debug log line "produced", which it builds only when its
// logger asks for debug lines. The publisher's own client logs through an
// answerLogger, which asks for them only while a Publish waits for records
// longer than usual or records it gave up wait in the client (never while
// the broker acknowledges promptly: no cost then), and keeps each
// partition's last error answer from those lines; explain adds it to the
// error of an event whose record was not acknowledged.

// answerTTL is how long a partition's error answer is told after it came
// (kgo retries such a partition every MetadataMinAge, 5 s by default,
// which renews it while the fault lasts).
const answerTTL = time.Minute

// forceEvery is how often at most a Publish that starts reading the
// answers asks the client for a metadata update (see Publisher.suspect).
const forceEvery = time.Second

// partitionKey names a partition.
type partitionKey struct {
	topic     string
	partition int32
}

// answer is a partition's last error answer, and when it came.
type answer struct {
	err error
	at  time.Time
}

// answers holds the partitions' last error answers (see answerLogger).
type answers struct {
	mu   sync.Mutex
	last map[partitionKey]answer
}

// answerLogger is the logger of the publisher's own client: it passes on
// to inner (the kgo.WithLogger of ExtraOpts, or nil) the lines inner's
// level asks for, and asks kgo for its debug lines while p.listening(),
// reading the brokers' answers from them.
type answerLogger struct {
	inner kgo.Logger
	p     *Publisher
}

var _ kgo.Logger = answerLogger{}

func (l answerLogger) Level() kgo.LogLevel {
	lvl := kgo.LogLevelNone
	if l.inner != nil {
		lvl = l.inner.Level()
	}
	if lvl < kgo.LogLevelDebug && l.p.listening() {
		return kgo.LogLevelDebug
	}
	return lvl
}

func (l answerLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelDebug && msg == "produced" {
		for i := 0; i+1 < len(keyvals); i += 2 {
			if k, _ := keyvals[i].(string); k == "to" {
				if to, ok := keyvals[i+1].(string); ok {
					l.p.answers.read(to, time.Now())
				}
			}
		}
	}
	if l.inner != nil && l.inner.Level() >= level {
		l.inner.Log(level, msg, keyvals...)
	}
}

// read records the answers in to, the "to" value of kgo's debug line
// "produced": for each topic of a produce response, topic[p{result}, ...],
// joined by ", ", where result is base=>end for a written batch,
// kind@base,n(ERR) for an error answer (kind: retrying, err, resetting,
// fatal), skipped@... for a batch that was not the partition's first (its
// answer says nothing new) and move:... for a partition that moved. An
// error answer is kept as the partition's last, a written batch forgets
// it. A line it cannot read is left as it is (kgo's format is not an API:
// the errors then say what they said before).
func (a *answers) read(to string, now time.Time) {
	for to != "" {
		open := strings.IndexByte(to, '[')
		if open < 0 {
			return
		}
		topic := strings.TrimPrefix(to[:open], ", ")
		to = to[open+1:]
		for {
			brace := strings.IndexByte(to, '{')
			if brace < 0 {
				return
			}
			p, err := strconv.ParseInt(to[:brace], 10, 32)
			if err != nil {
				return
			}
			to = to[brace+1:]
			// The result runs to its '}', or, with an error answer (whose
			// text may hold parentheses), to the first ")}".
			end := strings.IndexByte(to, '}')
			if end < 0 {
				return
			}
			result := to[:end]
			if paren := strings.IndexByte(result, '('); paren >= 0 {
				if end = strings.Index(to, ")}"); end < 0 {
					return
				}
				end++
				result = to[:end]
			}
			to = to[end+1:]
			a.note(partitionKey{topic, int32(p)}, result, now)
			if !strings.HasPrefix(to, ", ") {
				break
			}
			to = to[len(", "):]
		}
		if !strings.HasPrefix(to, "]") {
			return
		}
		to = to[1:]
	}
}

// note records result, a partition's result in a "produced" line.
func (a *answers) note(pk partitionKey, result string, now time.Time) {
	kind, rest, _ := strings.Cut(result, "@")
	switch {
	case strings.Contains(result, "=>") && !strings.HasPrefix(result, "skipped@"):
		a.mu.Lock()
		delete(a.last, pk)
		a.mu.Unlock()
	case kind == "retrying" || kind == "err" || kind == "resetting" || kind == "fatal":
		_, text, ok := strings.Cut(rest, "(")
		if !ok || !strings.HasSuffix(text, ")") {
			return
		}
		err := kafkaError(strings.TrimSuffix(text, ")"))
		a.mu.Lock()
		if a.last == nil {
			a.last = map[partitionKey]answer{}
		}
		a.last[pk] = answer{err: err, at: now}
		a.mu.Unlock()
	}
}

// forget forgets the answer of a partition that wrote a record.
func (a *answers) forget(topic string, partition int32) {
	a.mu.Lock()
	delete(a.last, partitionKey{topic, partition})
	a.mu.Unlock()
}

// kafkaErrors maps the names of Kafka's error codes to kgo's errors.
var kafkaErrors = sync.OnceValue(func() map[string]*kerr.Error {
	m := map[string]*kerr.Error{}
	for c := int16(-1); c < 512; c++ {
		if e := kerr.TypedErrorForCode(c); e != nil && e.Code == c {
			m[e.Message] = e
		}
	}
	return m
})

// kafkaError returns the error whose text kgo printed: kgo's error for its
// code, with what kgo added to it.
func kafkaError(text string) error {
	name, _, _ := strings.Cut(text, ":")
	e, ok := kafkaErrors()[name]
	switch {
	case !ok || !strings.HasPrefix(text, e.Error()):
		return errors.New(text)
	case text == e.Error():
		return e
	}
	return fmt.Errorf("%w%s", e, text[len(e.Error()):])
}

// forTopic returns the last error answers of topic's partitions within
// answerTTL of now, or nil if there are none.
func (a *answers) forTopic(topic string, now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var parts []partAnswer
	for pk, an := range a.last {
		switch {
		case now.Sub(an.at) > answerTTL:
			delete(a.last, pk)
		case pk.topic == topic:
			parts = append(parts, partAnswer{partition: pk.partition, answer: an})
		}
	}
	if len(parts) == 0 {
		return nil
	}
	slices.SortFunc(parts, func(x, y partAnswer) int { return int(x.partition) - int(y.partition) })
	return &brokerAnswer{parts: parts, now: now}
}

// partAnswer is a partition's last error answer.
type partAnswer struct {
	partition int32
	answer
}

// brokerAnswer is the error answers of a topic's partitions, by partition.
// Its text names each answer with its partitions and age (whole seconds:
// the relay groups the failures whose texts differ only in numbers), and it
// wraps their errors (kerr's).
type brokerAnswer struct {
	parts []partAnswer
	now   time.Time
}

func (b *brokerAnswer) Error() string {
	type group struct {
		text  string
		parts []string
		at    time.Time
	}
	var groups []*group
	for _, pa := range b.parts {
		text := pa.err.Error()
		i := slices.IndexFunc(groups, func(g *group) bool { return g.text == text })
		if i < 0 {
			groups = append(groups, &group{text: text})
			i = len(groups) - 1
		}
		g := groups[i]
		g.parts = append(g.parts, strconv.Itoa(int(pa.partition)))
		if pa.at.After(g.at) {
			g.at = pa.at
		}
	}
	var sb strings.Builder
	sb.WriteString("the broker's last answer to the topic's records: ")
	for i, g := range groups {
		if i > 0 {
			sb.WriteString("; ")
		}
		if len(g.parts) == 1 {
			sb.WriteString("partition ")
		} else {
			sb.WriteString("partitions ")
		}
		fmt.Fprintf(&sb, "%s (%d s ago): %s", strings.Join(g.parts, ", "), int(b.now.Sub(g.at)/time.Second), g.text)
	}
	return sb.String()
}

func (b *brokerAnswer) Unwrap() []error {
	errs := make([]error, len(b.parts))
	for i, pa := range b.parts {
		errs[i] = pa.err
	}
	return errs
}

// listening reports whether the publisher's own client logs its debug
// lines for the answers they hold: while a Publish waits for records
// longer than usual (suspects), or records a Publish gave up waiting for
// are in the client.
func (p *Publisher) listening() bool {
	return p.suspects.Load() > 0 || p.waiting.Load() > 0
}

// suspect marks a produce whose records wait longer than usual (no
// outcome within half the straggler wait, or its context ended): the
// client logs its debug lines, and the brokers' answers are read from
// them, until unsuspect. kgo retries a partition that answered a
// retriable error at its next metadata update, MetadataMinAge after the
// last one (5 s by default), and the first answer came before any wait
// was long: unless the answers were being read already, a metadata update
// is asked for now (at most every forceEvery), so that the partition is
// retried, and its answer read, within the straggler wait.
func (p *Publisher) suspect(cl *kgo.Client) {
	was := p.listening()
	p.suspects.Add(1)
	if was {
		return
	}
	now := time.Now().UnixNano()
	if last := p.forcedAt.Load(); now-last >= int64(forceEvery) && p.forcedAt.CompareAndSwap(last, now) {
		cl.ForceMetadataRefresh()
	}
}

// unsuspect ends a suspect.
func (p *Publisher) unsuspect() { p.suspects.Add(-1) }

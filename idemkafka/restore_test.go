package idemkafka_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// rewindGroup is the disaster-recovery runbook's offset reset, with the
// group's consumers stopped: every partition of topic to its first record
// published at or after at (the end, where none was), as
// kafka-consumer-groups.sh --reset-offsets --to-datetime does.
func rewindGroup(t *testing.T, adm *kadm.Client, group, topic string, at time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listed, err := adm.ListOffsetsAfterMilli(ctx, at.UnixMilli(), topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		t.Fatalf("list offsets of %s after %s: %v", topic, at, err)
	}
	if err := adm.CommitAllOffsets(ctx, group, listed.Offsets()); err != nil {
		t.Fatalf("commit the rewound offsets of %s: %v", group, err)
	}
}

// A database restored from a backup (or failed over to an asynchronous
// replica that lost its last commits) goes back in time; the consumer
// group's committed offsets do not. The events consumed after the backup
// lose their effects and their inbox rows, and are never delivered again:
// their effects are lost, silently. The runbook: stop the consumers,
// rewind the group's offsets to a time before the backup by more than the
// consumers' lag then (an event published before the backup may have been
// consumed after it), start them. The inbox drops what the restored
// database still has and applies the rest, each event once.
func TestRestoreRewindGroup(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	_, schema := testdb.Schema(t, 1)
	b := postgresAt(t, schema, true)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 3)
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	consumed := func(t *testing.T) {
		t.Helper()
		waitFor(t, 30*time.Second, "the log consumed", func() bool { return allCommitted(t, kc, group, topic) })
	}

	applied := newEvents(t, 20, 5)    // consumed before the backup
	lagging := newEvents(t, 10, 5)    // published before the backup, consumed after it
	afterwards := newEvents(t, 20, 5) // published and consumed after the backup
	inst := start(t, b, "billing", cfg)
	kc.Produce(t, topic, recordsOf(topic, applied...)...)
	consumed(t)
	mustStop(t, inst)
	kc.Produce(t, topic, recordsOf(topic, lagging...)...)
	backupAt := time.Now()
	backup := testdb.TakeSnapshot(t, schema)
	inst = start(t, b, "billing", cfg)
	kc.Produce(t, topic, recordsOf(topic, afterwards...)...)
	consumed(t)
	mustStop(t, inst)
	mustOnce(t, b, "billing", slices.Concat(applied, lagging, afterwards))

	backup.Restore(t)
	if got, want := distinct(t, b, "billing"), len(applied); got != want {
		t.Fatalf("restored database holds the effects of %d events; want %d", got, want)
	}
	// Started as it is, the consumer resumes at the group's offsets: the
	// events after the backup are lost. A marker published now is applied,
	// they are not.
	marker := newEvents(t, 1, 1)
	inst = start(t, b, "billing", cfg)
	kc.Produce(t, topic, recordsOf(topic, marker...)...)
	consumed(t)
	mustStop(t, inst)
	mustOnce(t, b, "billing", slices.Concat(applied, marker))

	// The runbook.
	rewindGroup(t, kc.Admin(), group, topic, backupAt.Add(-time.Minute))
	inst = start(t, b, "billing", cfg)
	consumed(t)
	mustStop(t, inst)
	mustOnce(t, b, "billing", slices.Concat(applied, marker, lagging, afterwards))
	if s := inst.stats.get(); s.applied != len(lagging)+len(afterwards) || s.duplicates != len(applied)+len(marker) {
		t.Errorf("after the rewind the consumer applied %d and skipped %d; want %d and %d",
			s.applied, s.duplicates, len(lagging)+len(afterwards), len(applied)+len(marker))
	}
}

// A producer's database restored from a backup has its outbox as it was:
// the events enqueued after the backup are gone with their operations,
// and the events published after the backup are unpublished again. The
// relay publishes those again with their event IDs, and a consumer whose
// database was not restored drops them through its inbox. The events
// enqueued after the backup and already published stay in Kafka and
// applied downstream, although their producer's operation is gone.
func TestRestoreRepublishesUnmarked(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	_, producerSchema := testdb.Schema(t, 1)
	producer := postgresAt(t, producerSchema, true)
	consumer := setupPostgres(t) // another service, its own database
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 3)
	drv := producer.open(t)
	pub := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return time.Millisecond },
		Logger:  testLogger(),
	})
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}
	publishAll := func(t *testing.T, want int) {
		t.Helper()
		published := 0
		for deadline := time.Now().Add(30 * time.Second); published < want; {
			if time.Now().After(deadline) {
				t.Fatalf("relay published %d of %d events", published, want)
			}
			n, _ := relay.RunOnce(t.Context())
			published += n
			if n == 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if n, err := relay.RunOnce(t.Context()); n != 0 || err != nil {
			t.Fatalf("relay published %d more events (%v); want none", n, err)
		}
	}

	published := newEvents(t, 10, 5) // enqueued and published before the backup
	unmarked := newEvents(t, 10, 5)  // enqueued before the backup, published after it
	lost := newEvents(t, 10, 5)      // enqueued and published after the backup
	enqueue(t, drv, published...)
	publishAll(t, len(published))
	enqueue(t, drv, unmarked...)
	backup := testdb.TakeSnapshot(t, producerSchema)
	publishAll(t, len(unmarked))
	enqueue(t, drv, lost...)
	publishAll(t, len(lost))

	inst := start(t, consumer, "billing", consumerConfig(kc, consumer, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "the log consumed", func() bool { return allCommitted(t, kc, group, topic) })

	backup.Restore(t)
	publishAll(t, len(unmarked))
	if got, want := len(kc.Records(t, topic)), len(published)+2*len(unmarked)+len(lost); got != want {
		t.Fatalf("log holds %d records; want %d (the events published after the backup twice)", got, want)
	}
	seen := map[string]int{}
	for _, r := range kc.Records(t, topic) {
		e, err := idemkafka.Envelope(r)
		if err != nil {
			t.Fatalf("Envelope: %v", err)
		}
		seen[e.ID.String()]++
	}
	for _, e := range unmarked {
		if seen[e.ID.String()] != 2 {
			t.Fatalf("event %s published %d times; want twice, with its ID", e.ID, seen[e.ID.String()])
		}
	}
	waitFor(t, 30*time.Second, "the log consumed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	mustOnce(t, consumer, "billing", slices.Concat(published, unmarked, lost))
	if s := inst.stats.get(); s.duplicates != len(unmarked) {
		t.Errorf("consumer skipped %d events as duplicates; want %d", s.duplicates, len(unmarked))
	}
	var n int
	if err := testdb.Pool(t, producerSchema, 1).QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		t.Fatalf("count outbox: %v", err)
	}
	if n != len(published)+len(unmarked) {
		t.Errorf("restored outbox holds %d events; want %d (those enqueued after the backup are gone)", n, len(published)+len(unmarked))
	}
}

// A service that consumes its own outbox's events (idemd's saga and
// projection) restores its outbox with its inbox: the group's offsets
// stay, and the events published since a time before the backup by more
// than the consumers' lag then are redriven from the restored outbox
// (outbox.Redrive, idemd outbox redrive -since). The inbox drops what the
// restored database still has and applies the rest; the events enqueued
// after the backup, whose operations the restore undid, stay unapplied.
// (Rewinding the group instead would apply them again.)
func TestRestoreRedriveOwnOutbox(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	_, schema := testdb.Schema(t, 1)
	b := postgresAt(t, schema, true)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 3)
	drv := b.open(t)
	pub := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return time.Millisecond },
		Logger:  testLogger(),
	})
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}
	publishAll := func(t *testing.T, want int) {
		t.Helper()
		published := 0
		for deadline := time.Now().Add(30 * time.Second); published < want; {
			if time.Now().After(deadline) {
				t.Fatalf("relay published %d of %d events", published, want)
			}
			n, _ := relay.RunOnce(t.Context())
			published += n
			if n == 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	consume := func(t *testing.T) *instance {
		t.Helper()
		inst := start(t, b, "billing", cfg)
		waitFor(t, 30*time.Second, "the log consumed", func() bool { return allCommitted(t, kc, group, topic) })
		mustStop(t, inst)
		return inst
	}

	applied := newEvents(t, 10, 5) // consumed before the backup
	lagging := newEvents(t, 10, 5) // published before the backup, consumed after it
	undone := newEvents(t, 10, 5)  // enqueued, published and consumed after the backup
	enqueue(t, drv, applied...)
	publishAll(t, len(applied))
	consume(t)
	enqueue(t, drv, lagging...)
	publishAll(t, len(lagging))
	backupAt := time.Now()
	backup := testdb.TakeSnapshot(t, schema)
	enqueue(t, drv, undone...)
	publishAll(t, len(undone))
	consume(t)
	mustOnce(t, b, "billing", slices.Concat(applied, lagging, undone))

	backup.Restore(t)
	n, err := outbox.Redrive(t.Context(), drv, outbox.RedriveOptions{Since: backupAt.Add(-time.Minute)})
	if err != nil || n != len(applied)+len(lagging) {
		t.Fatalf("Redrive: %d, %v; want %d", n, err, len(applied)+len(lagging))
	}
	publishAll(t, n)
	inst := consume(t)
	mustOnce(t, b, "billing", slices.Concat(applied, lagging))
	if s := inst.stats.get(); s.applied != len(lagging) || s.duplicates != len(applied) {
		t.Errorf("after the redrive the consumer applied %d and skipped %d; want %d and %d", s.applied, s.duplicates, len(lagging), len(applied))
	}
}

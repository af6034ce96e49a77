package app_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// A SIGTERM while Kafka does not answer produce requests (a broker hung, a
// partition's leader gone; the group coordinator answers): the relay's
// stop and its last flush give up on the records in flight (published
// again at the next start, same IDs), and the consumers still get their
// turn within -shutdown-timeout: they stop, commit and leave their groups,
// so that their partitions move to the other replicas at once rather than
// after the session timeout, and idemd exits 0.
func TestShutdownWithKafkaNotAcknowledging(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	fake := cluster.Fake(t)
	topic := kafkatest.Name("idemd-hungproduce")
	cluster.CreateTopic(t, topic, 3)
	cluster.CreateTopic(t, topic+".dlq", 1)
	dbArg, _ := dbSetting(t, app.Postgres)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- app.Run(ctx, []string{"-addr", "127.0.0.1:0", "-db", dbArg, "-kafka", strings.Join(cluster.Seeds, ","),
			"-kafka-topic", topic, "-shutdown-timeout", "12s"}, envOf(nil), stdout, stderr)
	}()
	var base string
	for deadline := time.Now().Add(60 * time.Second); base == ""; time.Sleep(10 * time.Millisecond) {
		if m := listenRe.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listen line; stderr %s", stderr.String())
		}
	}
	members := func() map[string]int {
		gs, err := cluster.Admin().DescribeGroups(context.Background(), app.ProjectionGroup, app.SagaGroup)
		if err != nil {
			t.Fatalf("describe groups: %v", err)
		}
		n := map[string]int{}
		for _, g := range gs {
			n[g.Group] = len(g.Members)
		}
		return n
	}
	waitFor(t, "both consumers in their groups", func() bool {
		m := members()
		return m[app.ProjectionGroup] == 1 && m[app.SagaGroup] == 1
	})

	var hung atomic.Bool
	fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		return nil, nil, hung.Load() // never answered while hung
	})
	hung.Store(true)
	order := func(i int) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(orderBody(i, "5.00")))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("hung-%d", i))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("POST: %d", res.StatusCode)
		}
	}
	order(1)
	time.Sleep(300 * time.Millisecond) // the relay's round waits on Kafka
	order(2)
	cancel() // SIGTERM
	var code int
	select {
	case code = <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of the signal (-shutdown-timeout 12s)")
	}
	if code != 0 {
		t.Errorf("exit code %d, want 0; stderr %s", code, stderr.String())
	}
	if strings.Contains(stderr.String(), "consumers did not stop") {
		t.Errorf("the consumers were not waited for: the flush took the whole -shutdown-timeout:\n%s", grepLines(stderr.String(), "shutdown"))
	}
	if m := members(); m[app.ProjectionGroup] != 0 || m[app.SagaGroup] != 0 {
		t.Errorf("members left in the groups when idemd returned: %v; want none (each consumer leaves its group)", m)
	}
	hung.Store(false)
}

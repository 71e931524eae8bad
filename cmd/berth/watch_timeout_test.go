package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/integration"
)

// freezeOnWrite is the stdout of a run that freezes a proxy the first time
// the run writes to it (its first refresh printed): every later call to the
// broker gets no answer.
type freezeOnWrite struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	once   sync.Once
	freeze func()
}

func (w *freezeOnWrite) Write(p []byte) (int, error) {
	w.once.Do(w.freeze)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *freezeOnWrite) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// watchThroughFrozenProxy runs "berth stats QUEUE -watch" with args on a
// queue of the SQS emulator reached through a proxy that freezes
// (connections open, nothing answered) once the first refresh is printed.
// It returns the result, the queue and how many refreshes were printed.
func watchThroughFrozenProxy(t *testing.T, args ...string) (result, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	endpoint := integration.SQSEndpoint(t)
	ob, err := brokerurl.Open(ctx, endpoint+"?region=us-east-1", brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := ob.(*sqs.Broker)
	queue := fmt.Sprintf("berth_cli_watch_%d", rand.Uint64()%1e12)
	t.Cleanup(func() {
		_ = b.DeleteQueue(context.Background(), queue, true)
		_ = b.Close()
	})
	if err := b.DeclareQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	pu, proxy := integration.ProxyURL(t, endpoint)
	pu.RawQuery = "region=us-east-1"
	out := &freezeOnWrite{freeze: proxy.Freeze}
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), append([]string{"-url", pu.String(), "stats", queue, "-watch"}, args...), env{
			stdin: strings.NewReader(""), stdout: out, stderr: &errOut, getenv: func(string) string { return "" }, open: openURL,
		})
	}()
	var code int
	select {
	case code = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("berth stats -watch %s is still running on a broker that stopped answering", strings.Join(args, " "))
	}
	return result{out.String(), errOut.String(), code}, queue, strings.Count(out.String(), "QUEUE")
}

// TestStatsWatchTimeoutHungRefresh: with -watch, a -timeout given bounds the
// whole watch, and the watch ending there is its normal end (exit 0). But
// when the broker stopped answering, the refresh in flight was cut by that
// deadline and the command still exited 0 without a word: the operator
// never learnt that the last refreshes got no answer. A refresh that had
// waited -interval (at least 1s) when -timeout cut it, or before any refresh
// answered, now ends the watch with exit 1 and says how long it waited.
func TestStatsWatchTimeoutHungRefresh(t *testing.T) {
	r, queue, tables := watchThroughFrozenProxy(t, "-interval", "1ms", "-timeout", "5s")
	for _, want := range []string{"berth stats: gave up after 5s (-timeout): a refresh of -watch had waited ", " with no answer: stats " + queue + ": "} {
		if r.code != exitError || !strings.Contains(r.err, want) {
			t.Fatalf("-watch -timeout 5s on a broker that stopped answering: exit %d, no %q in stderr %q", r.code, want, r.err)
		}
	}
	if tables != 1 || !strings.Contains(r.out, queue) {
		t.Errorf("want the one refresh that was answered, got %d:\n%s", tables, r.out)
	}

	// Before any refresh answered: the watch showed nothing, as a stats
	// without -watch that gives up (TestReadCommandsDefaultTimeout).
	addr := integration.SilentServer(t)
	done := make(chan result, 1)
	go func() {
		done <- cliOn(t, "http://"+addr+"?region=us-east-1", "stats", "billing", "-watch", "-timeout", "1500ms")
	}()
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("berth stats -watch -timeout 1500ms is still running on a server that does not answer")
	}
	for _, want := range []string{"berth stats: gave up after 1.5s (-timeout): a refresh of -watch had waited ", " with no answer: stats billing: "} {
		if r.code != exitError || !strings.Contains(r.err, want) {
			t.Fatalf("-watch -timeout 1500ms on a silent server: exit %d, no %q in stderr %q", r.code, want, r.err)
		}
	}
}

// TestStatsWatchTimeoutNormalEnd: a -timeout given that ends the watch
// between refreshes, or cuts a refresh that had waited less than -interval
// (the watch cannot tell it from a slow answer), is the watch's normal end:
// exit 0, nothing on stderr.
func TestStatsWatchTimeoutNormalEnd(t *testing.T) {
	b, _ := deadLettered(t, 1)
	if r := berth(t, b, "stats", "billing", "-watch", "-interval", "1h", "-timeout", "1s"); r.code != exitOK || r.err != "" ||
		!strings.Contains(r.out, "billing") {
		t.Fatalf("-watch -timeout 1s between refreshes: exit %d, stderr %q, out:\n%s", r.code, r.err, r.out)
	}
	// The second refresh starts at most 2s before the deadline: it has
	// waited less than -interval when the deadline cuts it (if it started).
	r, _, tables := watchThroughFrozenProxy(t, "-interval", "2s", "-timeout", "4s")
	if r.code != exitOK || r.err != "" || tables != 1 {
		t.Fatalf("-watch -interval 2s -timeout 4s: exit %d, stderr %q, %d refreshes:\n%s", r.code, r.err, tables, r.out)
	}
}

// TestStatsWatchEachRefreshBounded: with -watch and a -timeout given longer
// than the default, each refresh is still bounded by the default (1m;
// shortened here): a broker that stops answering ends the watch then, not
// only at the end of a long -timeout.
func TestStatsWatchEachRefreshBounded(t *testing.T) {
	defer func(d time.Duration) { readTimeout = d }(readTimeout)
	readTimeout = time.Second
	r, queue, tables := watchThroughFrozenProxy(t, "-interval", "1ms", "-timeout", "10m")
	want := "berth stats: a refresh of -watch got no answer within 1s (each refresh's bound, the default -timeout of stats; " +
		"the -timeout given, 10m0s, bounds the whole watch): stats " + queue + ": "
	if r.code != exitError || !strings.Contains(r.err, want) || tables != 1 {
		t.Fatalf("-watch -timeout 10m on a broker that stopped answering: exit %d, %d refreshes, no %q in stderr %q", r.code, tables, want, r.err)
	}
}

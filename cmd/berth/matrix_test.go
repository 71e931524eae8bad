package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/internal/dlq"
	"github.com/berthq/berth/sdk"
)

// hostile is text a producer or a failing handler may put in a message:
// an OSC title change, a screen clear, a right-to-left override and a C1 CSI.
const hostile = "\x1b]0;pwned\x07\x1b[2J\u202eevil\u009b31m"

// hostileShown is hostile as the CLI prints it.
const hostileShown = `\x1b]0;pwned\a\x1b[2J\u202eevil\u009b31m`

// deadLetterN publishes n messages to queue on b and dead-letters them
// through b: the i-th has type billing.charge (even i) or billing.refund
// (odd i); i%3 == 0 failed transiently ("timeout i"), the others
// permanently ("order i missing"). The last one's ID, a header and its
// reason carry hostile text. It returns the IDs.
func deadLetterN(t *testing.T, b sdk.Broker, queue string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, n)
	msgs := make([]*sdk.Message, n)
	for i := range n {
		typ := "billing.charge"
		if i%2 == 1 {
			typ = "billing.refund"
		}
		msgs[i] = &sdk.Message{Type: typ, Body: fmt.Appendf(nil, `{"n":%d}`, i)}
		if i == n-1 {
			msgs[i].ID = "id-" + hostile
			msgs[i].Headers = map[string]string{"note": hostile}
		}
	}
	if err := b.Publish(ctx, queue, msgs...); err != nil {
		t.Fatal(err)
	}
	for got := 0; got < n; {
		ds, err := b.Receive(ctx, queue, n-got)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			var i int
			fmt.Sscanf(string(d.Message().Body), `{"n":%d}`, &i)
			cause := sdk.Permanent(fmt.Errorf("order %d missing", i))
			switch {
			case i == n-1:
				cause = sdk.Permanent(errors.New("bad input: " + hostile))
			case i%3 == 0:
				cause = fmt.Errorf("timeout %d", i)
			}
			if err := d.DeadLetter(ctx, cause); err != nil {
				t.Fatal(err)
			}
			ids[i] = d.Message().ID
			got++
		}
	}
	return ids
}

// sqsDeadLettered declares a fresh queue on the SQS emulator through the
// CLI's own URL opener and dead-letters n messages on it (deadLetterN). It
// returns the URL, the queue, the broker and the IDs.
func sqsDeadLettered(t *testing.T, n int) (string, string, *sqs.Broker, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	u := integration.SQSEndpoint(t) + "?region=us-east-1&wait_time=1s"
	ob, err := brokerurl.Open(ctx, u, brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := ob.(*sqs.Broker)
	queue := fmt.Sprintf("berth_cli_%d", rand.Uint64()%1e12)
	t.Cleanup(func() {
		_ = b.DeleteQueue(context.Background(), queue, true)
		_ = b.Close()
	})
	if err := b.DeclareQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	return u, queue, b, deadLetterN(t, b, queue, n)
}

// statsAre waits (RabbitMQ's counters follow a redrive's confirms a moment
// later) until the CLI's stats of queue show ready and dead.
func statsAre(t *testing.T, u, queue string, ready, dead int64) {
	t.Helper()
	var st jsonStats
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := cliOn(t, u, "-json", "stats", queue)
		if r.code != 0 || json.Unmarshal([]byte(r.out), &st) != nil || len(st.Queues) != 1 {
			t.Fatalf("stats (exit %d): %s %s", r.code, r.out, r.err)
		}
		if st.Queues[0].Ready == ready && st.Queues[0].DeadLettered == dead {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want %d ready and %d dead", st.Queues[0], ready, dead)
		}
	}
}

// TestCLIMatrix drives the whole CLI through each broker's URL on dead
// letters that broker made: stats, every filter, show, dry runs, the
// confirmation, a partial redrive, a filtered purge, exit codes and
// escaping — the same commands and answers on SQS (an http:// endpoint),
// RabbitMQ and JetStream. (Memory and PostgreSQL: the tests of main_test.go
// and postgres_test.go.)
func TestCLIMatrix(t *testing.T) {
	const n = 7 // 0..6: transient 0,3; refunds 1,3,5; hostile 6 (permanent, charge)
	t.Run("sqs", func(t *testing.T) {
		u, queue, _, ids := sqsDeadLettered(t, n)
		cliMatrix(t, u, queue, ids, false)
	})
	t.Run("rabbitmq", func(t *testing.T) {
		b, u, queue := rabbitQueue(t, context.Background(), "berth-cli-matrix")
		ids := deadLetterN(t, b, queue, n)
		b.Close() // its consumer would take the redriven messages
		cliMatrix(t, u, queue, ids, false)
	})
	t.Run("jetstream", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		u := integration.NATSURL(t)
		queue := fmt.Sprintf("berth-cli-matrix-%d", rand.Uint64()%1e12)
		b, err := jetstream.Connect(ctx, u, jetstream.ConnectOptions{Name: "berth-cli-test"}, jetstream.Options{WaitTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = b.DeleteQueue(context.Background(), queue)
			_ = b.Close()
		})
		if err := b.DeclareQueue(ctx, queue); err != nil {
			t.Fatal(err)
		}
		cliMatrix(t, u, queue, deadLetterN(t, b, queue, n), true)
	})
}

// cliMatrix runs the CLI's commands on queue at u, whose 7 dead letters
// deadLetterN made; listsQueues: the broker can list its queues.
func cliMatrix(t *testing.T, u, queue string, ids []string, listsQueues bool) {
	n := len(ids)
	statsAre(t, u, queue, 0, int64(n))
	if r := cliOn(t, u, "stats"); listsQueues && (r.code != 0 || !strings.Contains(r.out, queue)) ||
		!listsQueues && (r.code != exitUsage || !strings.Contains(r.err, "name them")) {
		t.Fatalf("stats of every queue: %d %s %s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "stats", queue+"_missing"); r.code != exitNotFound {
		t.Errorf("stats of a missing queue: exit %d %s", r.code, r.err)
	}

	t.Run("list", func(t *testing.T) {
		r := cliOn(t, u, "dlq", "list", queue)
		if r.code != 0 || !strings.Contains(r.out, fmt.Sprintf("dead letters 1-%d of %d\n", n, n)) || !strings.Contains(r.out, ids[0]) {
			t.Fatalf("list (exit %d):\n%s%s", r.code, r.out, r.err)
		}
		for _, c := range []struct {
			args []string
			want int
		}{
			{[]string{"-class", "transient"}, 2},
			{[]string{"-class", "permanent"}, 5},
			{[]string{"-type", "billing.refund"}, 3},
			{[]string{"-type", "billing.refund,billing.charge"}, n},
			{[]string{"-reason", "missing"}, 4},
			{[]string{"-reason", "/^timeout [03]$/"}, 2},
			{[]string{"-newer-than", "1h"}, n},
		} {
			r := cliOn(t, u, append([]string{"-json", "dlq", "list", queue}, c.args...)...)
			var l jsonList
			if r.code != 0 || json.Unmarshal([]byte(r.out), &l) != nil || l.Matched != c.want || !l.Complete || *l.TotalDeadLetters != int64(n) {
				t.Errorf("list %v (exit %d): %s %s; want %d matched of %d", c.args, r.code, r.out, r.err, c.want, n)
			}
		}
		if r := cliOn(t, u, "dlq", "list", queue, "-older-than", "1h"); r.code != exitNotFound || !strings.Contains(r.out, "no dead letters shown of 0 matching") {
			t.Errorf("list of nothing: exit %d %s %s", r.code, r.out, r.err)
		}
		r = cliOn(t, u, "dlq", "list", queue, "-class", "permanent", "-limit", "2", "-offset", "1")
		if r.code != 0 || !strings.Contains(r.out, fmt.Sprintf("dead letters 2-3 of 5 matching (%d in the dead-letter queue of %s)", n, queue)) ||
			!strings.Contains(r.out, "next page: -offset 3") {
			t.Errorf("a filtered page (exit %d):\n%s%s", r.code, r.out, r.err)
		}
	})

	t.Run("show", func(t *testing.T) {
		r := cliOn(t, u, "dlq", "show", queue, ids[1])
		if r.code != 0 || !strings.Contains(r.out, `{"n":1}`) || !strings.Contains(r.out, "order 1 missing") || !strings.Contains(r.out, "class:         permanent") {
			t.Fatalf("show (exit %d):\n%s%s", r.code, r.out, r.err)
		}
		if r := cliOn(t, u, "dlq", "show", queue, "no-such-id"); r.code != exitNotFound || !strings.Contains(r.err, "no-such-id") {
			t.Fatalf("show of a missing ID: exit %d %s", r.code, r.err)
		}
		r = cliOn(t, u, "-json", "dlq", "show", queue, ids[n-1])
		var j dlq.Message
		if r.code != 0 || json.Unmarshal([]byte(r.out), &j) != nil || j.ID != ids[n-1] || j.Headers["note"] != hostile || strings.Contains(r.out, "\x1b") {
			t.Fatalf("show -json of the hostile one (exit %d): %s %s", r.code, r.out, r.err)
		}
	})

	t.Run("escaping", func(t *testing.T) {
		for _, args := range [][]string{
			{"dlq", "list", queue},
			{"dlq", "show", queue, ids[n-1]},
			{"dlq", "redrive", queue, "-reason", "bad input", "-dry-run"},
			{"dlq", "purge", queue, ids[n-1], "-dry-run"},
		} {
			r := cliOn(t, u, args...)
			if r.code != 0 {
				t.Fatalf("%v: exit %d %s", args, r.code, r.err)
			}
			for _, raw := range []string{"\x1b", "\x07", "\u202e", "\u009b"} {
				if strings.Contains(r.out, raw) || strings.Contains(r.err, raw) {
					t.Errorf("%v printed %q raw:\n%s", args, raw, r.out)
				}
			}
			if !strings.Contains(r.out, hostileShown) {
				t.Errorf("%v: the escaped ID or reason is not shown:\n%s", args, r.out)
			}
		}
	})

	t.Run("change", func(t *testing.T) {
		// A dry run and a refusal without -yes change nothing.
		r := cliOn(t, u, "dlq", "redrive", queue, "-reason", "timeout", "-dry-run")
		if r.code != 0 || !strings.Contains(r.out, "dry run: would redrive 2 dead letter(s) of "+queue+"; nothing changed") || !strings.Contains(r.out, "timeout 3") {
			t.Fatalf("dry run (exit %d):\n%s%s", r.code, r.out, r.err)
		}
		if r := cliOn(t, u, "dlq", "purge", queue, "-class", "nope", "-dry-run"); r.code != exitNotFound {
			t.Fatalf("dry run of nothing: exit %d %s", r.code, r.err)
		}
		if r := cliOn(t, u, "dlq", "purge", queue); r.code != exitUsage || !strings.Contains(r.err, "without -yes") {
			t.Fatalf("purge without -yes: exit %d %s", r.code, r.err)
		}
		statsAre(t, u, queue, 0, int64(n))
		// 4: partial — one chosen ID is not a dead letter; the other moves.
		r = cliOn(t, u, "dlq", "redrive", queue, ids[1], "no-such-id", "-yes")
		if r.code != exitPartial || !strings.Contains(r.out, "redriven 1 ") || !strings.Contains(r.out, "no-such-id") {
			t.Fatalf("partial redrive (exit %d):\n%s%s", r.code, r.out, r.err)
		}
		// A filtered redrive, then one that matches nothing (3).
		r = cliOn(t, u, "-json", "dlq", "redrive", queue, "-class", "transient", "-yes")
		var rep jsonChange
		if r.code != 0 || json.Unmarshal([]byte(r.out), &rep) != nil || rep.Done != 2 || rep.Matched != 2 || !rep.Complete || rep.Missed != 0 {
			t.Fatalf("filtered redrive (exit %d): %s %s", r.code, r.out, r.err)
		}
		if r := cliOn(t, u, "dlq", "redrive", queue, "-class", "transient", "-yes"); r.code != exitNotFound {
			t.Fatalf("redrive of nothing: exit %d %s %s", r.code, r.out, r.err)
		}
		statsAre(t, u, queue, 3, int64(n-3))
		// A filtered purge and a purge by ID delete exactly the chosen ones.
		if r := cliOn(t, u, "dlq", "purge", queue, "-reason", "bad input", "-yes"); r.code != 0 || !strings.Contains(r.out, "purged 1 ") {
			t.Fatalf("filtered purge (exit %d):\n%s%s", r.code, r.out, r.err)
		}
		if r := cliOn(t, u, "dlq", "purge", queue, ids[2], "-yes"); r.code != 0 || !strings.Contains(r.out, "purged 1 ") {
			t.Fatalf("purge by ID (exit %d):\n%s%s", r.code, r.out, r.err)
		}
		statsAre(t, u, queue, 3, int64(n-5))
		// Purge all; then nothing is left to purge (3).
		if r := cliOn(t, u, "dlq", "purge", queue, "-yes"); r.code != 0 || !strings.Contains(r.out, fmt.Sprintf("purged %d ", n-5)) {
			t.Fatalf("purge all (exit %d):\n%s%s", r.code, r.out, r.err)
		}
		if r := cliOn(t, u, "dlq", "purge", queue, "-yes"); r.code != exitNotFound {
			t.Fatalf("purge of an empty dead-letter queue: exit %d %s %s", r.code, r.out, r.err)
		}
		statsAre(t, u, queue, 3, 0)
	})
}

// TestOnSQSScanIncomplete: SQS cannot page its dead letters, so the CLI
// reads at most -scan-limit of them in one scan, and a broker call's own
// scan can stop early (here: a second copy of a message the redrive already
// moved). Either way the CLI says the scan is incomplete, counts what it did
// and what the broker still holds, and a change exits 4. A capped list
// and a capped dry run exit 4 too, saying on stderr that it is partial and how to see the rest:
// before, it exited 0 (3 when none of the letters read matched), and a
// script took the first -scan-limit dead letters for all of them.
func TestOnSQSScanIncomplete(t *testing.T) {
	const n = 7
	u, queue, b, _ := sqsDeadLettered(t, n)
	partial := func(r result) bool {
		return r.code == exitPartial && strings.Contains(r.err, "the list is partial") && strings.Contains(r.err, "raise -scan-limit (it was 3)")
	}
	r := cliOn(t, u, "-json", "dlq", "list", queue, "-class", "permanent", "-scan-limit", "3")
	var l jsonList
	if !partial(r) || json.Unmarshal([]byte(r.out), &l) != nil || l.Complete || !strings.Contains(l.Incomplete, "only the first 3") ||
		l.Matched > 3 || *l.TotalDeadLetters != n {
		t.Fatalf("capped list (exit %d): %s %s", r.code, r.out, r.err)
	}
	r = cliOn(t, u, "dlq", "list", queue, "-reason", "/./", "-scan-limit", "3")
	if !partial(r) || !strings.Contains(r.out, "of at least 3 matching (the broker cannot page its dead letters: only the first 3 were read) (7 in the dead-letter queue") {
		t.Fatalf("capped list, text (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	// None of the letters read matches: not "nothing matched" (exit 3).
	r = cliOn(t, u, "dlq", "list", queue, "-type", "no.such.type", "-scan-limit", "3")
	if !partial(r) || !strings.Contains(r.out, "no dead letters shown of at least 0 matching") {
		t.Fatalf("capped list, none of the first 3 matching (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	// Read to the end: complete, exit 0.
	if r := cliOn(t, u, "dlq", "list", queue, "-reason", "/./"); r.code != exitOK || r.err != "" {
		t.Fatalf("uncapped list (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	r = cliOn(t, u, "dlq", "redrive", queue, "-reason", "/./", "-scan-limit", "3", "-dry-run")
	if r.code != exitPartial || !strings.Contains(r.err, "the dry run is partial") || !strings.Contains(r.out, "would redrive at least 3 dead letter(s)") || !strings.Contains(r.out, "the scan stopped before the end of the dead-letter queue") {
		t.Fatalf("capped dry run (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	// A capped change moves what it saw and exits 4.
	r = cliOn(t, u, "-json", "dlq", "redrive", queue, "-reason", "/./", "-scan-limit", "3", "-yes")
	var rep jsonChange
	if r.code != exitPartial || json.Unmarshal([]byte(r.out), &rep) != nil || rep.Done != 3 || rep.Complete || rep.Incomplete == "" {
		t.Fatalf("capped redrive (exit %d): %s %s", r.code, r.out, r.err)
	}
	statsAre(t, u, queue, 3, n-3)
	// The broker's own redrive of all stops at a second copy of a message
	// it already moved: the CLI reports it as partial, with what is left.
	ctx := context.Background()
	dup := &sdk.Message{ID: sdk.NewID(), Type: "dl", Body: []byte("twice")}
	for range 2 {
		if err := b.Publish(ctx, queue+"-dlq", dup.Clone()); err != nil {
			t.Fatal(err)
		}
	}
	r = cliOn(t, u, "dlq", "redrive", queue, "-yes")
	if r.code != exitPartial || !strings.Contains(r.out, fmt.Sprintf("redriven %d dead letter(s)", n-3+1)) ||
		!strings.Contains(r.out, "the scan stopped before the end of the dead-letter queue: ") ||
		!strings.Contains(r.out, "the broker still counts 1 dead letter(s)") || !strings.Contains(r.err, "run it again") {
		t.Fatalf("redrive all with a duplicate (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	t.Logf("redrive all with a duplicate: exit %d\n%s%s", r.code, r.out, r.err)
	statsAre(t, u, queue, n+1, 1)
}

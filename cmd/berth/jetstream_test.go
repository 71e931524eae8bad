package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// TestOnJetStream drives the CLI through its nats:// URL on dead letters a
// JetStream broker made: list by class, redrive by reason, stats, purge.
func TestOnJetStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	u := integration.NATSURL(t)
	queue := fmt.Sprintf("berth-cli-test-%d", rand.Uint64()%1e12)
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
	for i := range 5 {
		if err := b.Publish(ctx, queue, &sdk.Message{Type: "billing.charge", Body: fmt.Appendf(nil, `{"n":%d}`, i)}); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 5; {
		ds, err := b.Receive(ctx, queue, 5-got)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			var n int
			fmt.Sscanf(string(d.Message().Body), `{"n":%d}`, &n)
			cause := sdk.Permanent(fmt.Errorf("card %d declined", n))
			if n%2 == 0 {
				cause = fmt.Errorf("timeout %d", n)
			}
			if err := d.DeadLetter(ctx, cause); err != nil {
				t.Fatal(err)
			}
			got++
		}
	}
	r := cliOn(t, u, "dlq", "list", queue, "-class", "transient")
	if r.code != 0 || !strings.Contains(r.out, "of 3 matching (5 in the dead-letter queue") {
		t.Fatalf("list (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "dlq", "redrive", queue, "-reason", "timeout", "-yes"); r.code != 0 || !strings.Contains(r.out, "redriven 3 ") {
		t.Fatalf("redrive (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	r = cliOn(t, u, "-json", "stats", queue)
	if r.code != 0 || !strings.Contains(r.out, `"ready":3`) || !strings.Contains(r.out, `"dead_lettered":2`) {
		t.Fatalf("stats after redrive (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "stats"); r.code != 0 || !strings.Contains(r.out, queue) {
		t.Fatalf("stats of every queue (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "dlq", "purge", queue, "-yes"); r.code != 0 || !strings.Contains(r.out, "purged 2 ") {
		t.Fatalf("purge all (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if r := cliOn(t, u, "stats", queue+"-missing"); r.code == 0 {
		t.Errorf("stats of a queue that does not exist: exit 0\n%s", r.out)
	}
}

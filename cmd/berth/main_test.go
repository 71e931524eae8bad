package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deadLettered returns a memory broker whose queue "billing" holds one ready
// message and two dead letters.
func deadLettered(t *testing.T) (*memory.Broker, []string) {
	t.Helper()
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	msgs := []*sdk.Message{
		{Type: "billing.charge", Body: []byte(`{"order":"o1"}`)},
		{Type: "billing.charge", Body: []byte{0xff, 0x00}},
		{Type: "billing.charge", Body: []byte(`{"order":"o3"}`)},
	}
	if err := b.Publish(ctx, "billing", msgs...); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "billing", 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("receive: %d %v", len(ds), err)
	}
	var ids []string
	for _, d := range ds {
		if err := d.DeadLetter(ctx, sdk.Permanent(errors.New("order missing"))); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d.Message().ID)
	}
	return b, ids
}

func berth(t *testing.T, b *memory.Broker, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut, func(ctx context.Context, _ target) (sdk.Broker, error) {
		return nopClose{b}, nil
	})
	return out.String(), errOut.String(), code
}

// nopClose keeps the test's broker open across commands.
type nopClose struct{ *memory.Broker }

func (nopClose) Close() error { return nil }

func TestStats(t *testing.T) {
	b, _ := deadLettered(t)
	out, errOut, code := berth(t, b, "-json", "stats", "billing")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var st []map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if st[0]["queue"] != "billing" || st[0]["ready"] != 1.0 || st[0]["dead_lettered"] != 2.0 {
		t.Fatalf("stats %v", st)
	}
	out, _, _ = berth(t, b, "stats", "billing")
	if !strings.Contains(out, "QUEUE") || !strings.Contains(out, "billing") {
		t.Fatalf("table output: %s", out)
	}
}

func TestDeadLetterListShowRedrivePurge(t *testing.T) {
	b, ids := deadLettered(t)
	out, _, code := berth(t, b, "dlq", "list", "billing")
	if code != 0 || !strings.Contains(out, "order missing") || !strings.Contains(out, "2 dead letter(s)") {
		t.Fatalf("list (exit %d): %s", code, out)
	}
	out, _, code = berth(t, b, "-json", "dlq", "show", "billing", ids[0])
	var m jsonMessage
	if code != 0 || json.Unmarshal([]byte(out), &m) != nil || m.ID != ids[0] || m.Headers[sdk.HeaderDeadLetterClass] != "permanent" {
		t.Fatalf("show (exit %d): %s", code, out)
	}
	out, _, code = berth(t, b, "dlq", "show", "billing", ids[1])
	if code != 0 || !strings.Contains(out, "berth-dlq-reason") {
		t.Fatalf("show text (exit %d): %s", code, out)
	}
	out, _, code = berth(t, b, "dlq", "redrive", "billing", ids[0])
	if code != 0 || !strings.Contains(out, "redriven 1") {
		t.Fatalf("redrive one (exit %d): %s", code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, _ := b.Stats(ctx, "billing")
	if st.Ready != 2 || st.DeadLettered != 1 {
		t.Fatalf("after redrive: %+v", st)
	}
	out, _, code = berth(t, b, "dlq", "purge", "billing")
	if code != 0 || !strings.Contains(out, "purged 1") {
		t.Fatalf("purge (exit %d): %s", code, out)
	}
	_, errOut, code := berth(t, b, "dlq", "show", "billing", "no-such-id")
	if code != 1 || !strings.Contains(errOut, "no-such-id") {
		t.Fatalf("show of a missing id: exit %d, %s", code, errOut)
	}
}

func TestUsageErrors(t *testing.T) {
	b, _ := deadLettered(t)
	for _, args := range [][]string{{}, {"frobnicate"}, {"stats"}, {"dlq", "list"}, {"dlq", "zap", "billing"}, {"dlq", "show", "billing"}} {
		if _, _, code := berth(t, b, args...); code != 2 {
			t.Errorf("berth %v: exit %d, want 2 (usage)", args, code)
		}
	}
}

func TestOpenNeverEchoesTheURL(t *testing.T) {
	const secret = "postgres://admin:hunter2@db.internal/app"
	for _, kind := range []string{"", "kafka"} {
		_, err := open(context.Background(), target{kind: kind, url: secret})
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("open(%q) = %v", kind, err)
		}
	}
	if _, err := open(context.Background(), target{kind: "postgres"}); !errors.Is(err, errNoURL) {
		t.Errorf("no URL: %v", err)
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// lettered is a memory broker whose queue billing holds msgs as dead
// letters, in order.
func lettered(t *testing.T, msgs ...*sdk.Message) *memory.Broker {
	t.Helper()
	ctx := context.Background()
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for _, m := range msgs {
		if err := b.Publish(ctx, "billing", m); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, "billing", 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("receive: %d %v", len(ds), err)
		}
		if err := ds[0].DeadLetter(ctx, sdk.Permanent(errors.New("bad"))); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// dupLettered is a memory broker whose queue billing holds two dead
// letters with the ID dup (a producer that reused a message ID) and one
// with the ID own.
func dupLettered(t *testing.T) *memory.Broker {
	t.Helper()
	return lettered(t, &sdk.Message{ID: "dup", Type: "billing.charge"}, &sdk.Message{ID: "dup", Type: "billing.charge"},
		&sdk.Message{ID: "own", Type: "billing.charge"})
}

// berth dlq purge billing -- dup deletes the two letters holding dup: the
// dry run and the question count 2 and say why, and a change limited to
// fewer letters than the ID holds (-limit 1) deletes none, says why and
// exits 4. Before, both counted 1, and -limit 1 deleted 2.
func TestSharedIDCountsEveryLetterInTheCLI(t *testing.T) {
	b := dupLettered(t)
	ctx := context.Background()
	r := berth(t, b, "dlq", "purge", "billing", "-dry-run", "--", "dup")
	if r.code != exitOK || !strings.Contains(r.out, "would purge 2 dead letter(s) of billing") || !strings.Contains(r.out, "2 of them share their ID") {
		t.Errorf("dry run (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	r = berthEnv(t, ctx, b, env{interactive: true, stdin: strings.NewReader("n\n")}, "dlq", "purge", "billing", "--", "dup")
	if !strings.Contains(r.err, "delete 2 (2 of them share their ID with other dead letters") {
		t.Errorf("question (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	r = berth(t, b, "dlq", "purge", "billing", "-limit", "1", "-yes", "--", "dup")
	if st := stats(t, b); st.DeadLettered != 3 {
		t.Fatalf("-limit 1 left %d of 3 dead letters (exit %d):\n%s%s", st.DeadLettered, r.code, r.out, r.err)
	}
	if r.code != exitPartial || !strings.Contains(r.out, "not purged: dup: more dead letters hold this ID than the change may touch: 2 dead letters hold it") {
		t.Errorf("-limit 1 (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	r = berthEnv(t, ctx, b, env{interactive: true, stdin: strings.NewReader("y\n")}, "dlq", "purge", "billing", "--", "dup")
	if r.code != exitOK || !strings.Contains(r.out, "purged 2 dead letter(s)") {
		t.Errorf("purge (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if st := stats(t, b); st.DeadLettered != 1 {
		t.Errorf("%d dead letters left, want 1", st.DeadLettered)
	}
}

// berth dlq redrive billing -type billing.charge, where the ID dup is held
// by a letter of that type and one of another: a redrive of dup moves both,
// so the change leaves it, names it and exits 4, and the dry run and the
// question say so. Before, the question counted 2 (and the dry run exited
// 0), and the change confirmed for 2 redrove all 3 letters.
func TestFilterLeavesSharedIDInTheCLI(t *testing.T) {
	ctx := context.Background()
	b := lettered(t, &sdk.Message{ID: "dup", Type: "billing.charge"}, &sdk.Message{ID: "dup", Type: "billing.refund"},
		&sdk.Message{ID: "own", Type: "billing.charge"})
	r := berth(t, b, "dlq", "redrive", "billing", "-type", "billing.charge", "-dry-run")
	if r.code != exitPartial || !strings.Contains(r.out, "would redrive 1 dead letter(s) of billing") || !strings.Contains(r.out, "1 more match, but would be left") {
		t.Errorf("dry run (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	// The dry run names dup as the change would (it only counted it).
	if !strings.Contains(r.out, "would not redrive: dup: dead letters the change did not choose hold this ID too: 2 dead letters hold this ID and only 1 of them") {
		t.Errorf("the dry run does not name dup:\n%s", r.out)
	}
	r = berth(t, b, "dlq", "redrive", "billing", "-type", "billing.charge", "-dry-run", "-json")
	var dry struct {
		Missed int `json:"missed"`
		Failed []struct {
			ID    string `json:"id"`
			Error string `json:"error"`
		} `json:"failed"`
	}
	if err := json.Unmarshal([]byte(r.out), &dry); err != nil || r.code != exitPartial || dry.Missed != 1 || len(dry.Failed) != 1 || dry.Failed[0].ID != "dup" ||
		!strings.HasPrefix(dry.Failed[0].Error, "dead letters the change did not choose hold this ID too: 2 dead letters hold this ID") {
		t.Errorf("dry run -json (exit %d, %v): %+v\n%s", r.code, err, dry, r.out)
	}
	// The bar of the change confirmed counts the letters it moves (own),
	// not those it leaves: it ends at 1/1, not 1/2.
	defer func(d time.Duration) { barThrottle = d }(barThrottle)
	barThrottle = 0
	r = berthEnv(t, ctx, b, env{interactive: true, progress: true, stdin: strings.NewReader("y\n")}, "dlq", "redrive", "billing", "-type", "billing.charge")
	if !strings.Contains(r.err, "redrive 1 (1 more match, but are left: dead letters the filter does not choose") {
		t.Errorf("question (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if m := barCount.FindAllStringSubmatch(r.err, -1); len(m) == 0 || m[len(m)-1][1] != "1" || m[len(m)-1][2] != "1" {
		t.Errorf("the bar's last count: %v; want 1/1:\n%q", m, r.err)
	}
	if st := stats(t, b); st.DeadLettered != 2 {
		t.Fatalf("the redrive left %d of 3 dead letters, want the 2 holding dup (exit %d):\n%s%s", st.DeadLettered, r.code, r.out, r.err)
	}
	if r.code != exitPartial || !strings.Contains(r.out, "redriven 1 dead letter(s)") ||
		!strings.Contains(r.out, "not redriven: dup: dead letters the change did not choose hold this ID too: 2 dead letters hold this ID and only 1 of them") {
		t.Errorf("redrive (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	// Nothing left to redrive by the filter alone: said, nothing changed.
	r = berthEnv(t, ctx, b, env{interactive: true, stdin: strings.NewReader("y\n")}, "dlq", "redrive", "billing", "-type", "billing.charge")
	if r.code != exitPartial || !strings.Contains(r.err, "1 dead letter(s) of billing match, but dead letters the filter does not choose") {
		t.Errorf("second redrive (exit %d):\n%s%s", r.code, r.out, r.err)
	}
	if st := stats(t, b); st.DeadLettered != 2 {
		t.Errorf("%d dead letters left, want 2", st.DeadLettered)
	}
}

// A dry run names the IDs it would leave escaped, as the change's failures
// are: an ID is untrusted text, and a raw ESC would drive the terminal.
func TestDryRunEscapesWithheldIDs(t *testing.T) {
	const odd = "d\x1b[2J\u202e"
	b := lettered(t, &sdk.Message{ID: odd, Type: "billing.charge"}, &sdk.Message{ID: odd, Type: "billing.refund"})
	r := berth(t, b, "dlq", "purge", "billing", "-type", "billing.charge", "-dry-run")
	if r.code != exitPartial || !strings.Contains(r.out, "would not purge: "+esc(odd)+": dead letters the change did not choose") || strings.ContainsAny(r.out, "\x1b\u202e") {
		t.Errorf("dry run (exit %d):\n%q", r.code, r.out)
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// scriptedRedrive is a memory broker whose RedriveDeadLetters calls answer
// as script says, call by call: "ok" (the memory broker's answer),
// "gone" (sdk.ErrNotFound) or "lost" (a connection error).
type scriptedRedrive struct {
	*memory.Broker
	script []string
	calls  atomic.Int32
}

func (s *scriptedRedrive) Close() error { return nil }

func (s *scriptedRedrive) RedriveDeadLetters(ctx context.Context, q string, ids ...string) (int, error) {
	i := int(s.calls.Add(1)) - 1
	switch {
	case i < len(s.script) && s.script[i] == "gone":
		return 0, sdk.ErrNotFound
	case i >= len(s.script) || s.script[i] == "lost":
		return 0, errors.New("broker connection \x1b[31mlost")
	}
	return s.Broker.RedriveDeadLetters(ctx, q, ids...)
}

// A redrive that fails part-way reports what it did before the error, in
// the output chosen (-json: the JSON document), with the letters not moved
// and the partial exit status.
func TestChangeErrorPartWay(t *testing.T) {
	// Pages of 2 of 5 dead letters: the first is redriven; in the second,
	// one is gone (redriven one by one: gone, ok); the third fails.
	script := []string{"ok", "gone", "gone", "ok", "lost"}
	for _, asJSON := range []bool{true, false} {
		b, ids := deadLettered(t, 5)
		sb := &scriptedRedrive{Broker: b, script: script}
		args := []string{"dlq", "redrive", "billing", "-yes", "-page-size", "2"}
		if asJSON {
			args = append(args, "-json")
		}
		r := berthEnv(t, context.Background(), b, env{open: func(context.Context, string) (sdk.Broker, error) { return sb, nil }}, args...)
		if left := stats(t, b).DeadLettered; left != 2 {
			t.Fatalf("%d dead letters left, want 2", left)
		}
		if r.code != exitPartial || !strings.Contains(r.err, "redriven 3 dead letter(s)") || !strings.Contains(r.err, `connection \x1b[31mlost`) {
			t.Errorf("json %v: exit %d (want %d), stderr %q", asJSON, r.code, exitPartial, r.err)
		}
		if asJSON {
			var doc struct {
				Done, Missed int
				Failed       []jsonFailure
				Error        string
			}
			if err := json.Unmarshal([]byte(strings.TrimSpace(r.out)), &doc); err != nil {
				t.Errorf("-json: stdout %q is not the JSON document: %v", r.out, err)
				continue
			}
			if doc.Done != 3 || doc.Missed != 1 || len(doc.Failed) != 1 || doc.Failed[0].ID != ids[2] || !strings.Contains(doc.Error, "connection") {
				t.Errorf("-json: %+v", doc)
			}
			continue
		}
		if !strings.Contains(r.out, "redriven 3 dead letter(s) of billing before the error") ||
			!strings.Contains(r.out, "not redriven: "+ids[2]+": ") {
			t.Errorf("text: %q", r.out)
		}
	}
	// An error before anything was done: exit 1, nothing on stdout.
	b, _ := deadLettered(t, 3)
	sb := &scriptedRedrive{Broker: b, script: []string{"lost"}}
	r := berthEnv(t, context.Background(), b, env{open: func(context.Context, string) (sdk.Broker, error) { return sb, nil }},
		"dlq", "redrive", "billing", "-yes", "-json")
	if r.code != exitError || r.out != "" || stats(t, b).DeadLettered != 3 {
		t.Errorf("error at once: exit %d, stdout %q", r.code, r.out)
	}
}

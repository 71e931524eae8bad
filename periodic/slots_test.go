package periodic_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/periodic"
	"github.com/berthq/berth/sdk"
)

// keyRecorder records each published message's key and slot header at
// publish time.
type keyRecorder struct {
	mu    sync.Mutex
	keys  []string
	slots []string
}

func (r *keyRecorder) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.keys = append(r.keys, m.IdempotencyKey)
		r.slots = append(r.slots, m.Header(periodic.HeaderSlot))
	}
	return nil
}

// A Message func that returns the same template for every slot (it depends
// on nothing, so certainly on the slot only) must still give each slot its
// own key: the scheduler completes a copy, not the caller's message.
func TestSharedMessageTemplateGetsEachSlotsKey(t *testing.T) {
	tmpl := &sdk.Message{Body: []byte(`{"sweep":true}`)}
	c := periodic.NewFakeClock(t0)
	pub := &keyRecorder{}
	s, err := periodic.New(pub, periodic.Options{Clock: c}, periodic.Job{
		Name: "sweep", Schedule: every(t, time.Minute), Queue: "q",
		Message: func(time.Time) (*sdk.Message, error) { return tmpl, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, c, time.Minute, time.Minute, time.Minute)
	seen := map[string]bool{}
	for i, k := range pub.keys {
		if seen[k] {
			t.Errorf("slot %s published with key %q, already used by an earlier slot", pub.slots[i], k)
		}
		seen[k] = true
	}
	if len(pub.keys) != 3 {
		t.Fatalf("published %d slots, want 3", len(pub.keys))
	}
	if tmpl.IdempotencyKey != "" || tmpl.ID != "" || len(tmpl.Headers) != 0 {
		t.Errorf("the caller's template was modified: %+v", tmpl)
	}
}

// A jump of exactly maxScan slots whose last slot is now must not publish
// that slot twice.
func TestLongCatchUpPublishesEachSlotOnce(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	pub := &keyRecorder{}
	s, err := periodic.New(pub, periodic.Options{Clock: c, Missed: periodic.CatchUp}, periodic.Job{
		Name: "tick", Schedule: every(t, time.Second), Queue: "q",
	})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, c, 100_000*time.Second)
	seen := map[string]bool{}
	for _, k := range pub.keys {
		if seen[k] {
			t.Errorf("slot key %q published twice", k)
		}
		seen[k] = true
	}
	if len(pub.keys) != 10 {
		t.Errorf("published %d slots, want MaxCatchUp = 10", len(pub.keys))
	}
}

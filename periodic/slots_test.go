package periodic_test

import (
	"context"
	"fmt"
	"slices"
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

// A pause longer than maxScan (100 000) slots — a one-second job on a host
// suspended for two days, or a clock stepped years ahead at boot — made
// collect stop walking after 100 000 slots and jump to now, keeping the
// slots of that first stretch: Skip published a slot from a day and a half
// before (not the latest due one), CatchUp nine stale slots and the newest.
// The policies keep the most recent due slots, however many were missed.
func TestLongPauseKeepsMostRecentSlots(t *testing.T) {
	for _, tc := range []struct {
		missed periodic.MissedPolicy
		slots  int // missed, more than the scan bound (100 000)
		want   int
	}{
		{periodic.Skip, 150_000, 1},
		{periodic.CatchUp, 150_000, 10},
		{periodic.CatchUp, 100_005, 10}, // fewer than MaxCatchUp past the bound
	} {
		missed := tc.slots
		t.Run(fmt.Sprintf("%s/%d", tc.missed, missed), func(t *testing.T) {
			c := periodic.NewFakeClock(t0)
			pub := &keyRecorder{}
			s, err := periodic.New(pub, periodic.Options{Clock: c, Missed: tc.missed}, periodic.Job{
				Name: "tick", Schedule: every(t, time.Second), Queue: "q",
			})
			if err != nil {
				t.Fatal(err)
			}
			// now between two slots: the latest due one is t0+missed s
			drive(t, s, c, time.Duration(missed)*time.Second+500*time.Millisecond)
			var want []string
			for i := missed - tc.want + 1; i <= missed; i++ {
				want = append(want, t0.Add(time.Duration(i)*time.Second).Format(time.RFC3339Nano))
			}
			if !slices.Equal(pub.slots, want) {
				t.Errorf("published slots %v, want the %d most recent due: %v", pub.slots, tc.want, want)
			}
		})
	}
}

// A host that boots with its clock at the epoch (no RTC) and starts the
// scheduler before NTP steps the clock 56 years ahead: Skip publishes the
// slot now due, not one from 1970.
func TestClockSteppedYearsAheadPublishesCurrentSlot(t *testing.T) {
	boot := time.Unix(0, 0).UTC()
	c := periodic.NewFakeClock(boot)
	pub := &keyRecorder{}
	s, err := periodic.New(pub, periodic.Options{Clock: c}, periodic.Job{
		Name: "minutely", Schedule: every(t, time.Minute), Queue: "q",
	})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, c, t0.Add(30*time.Second).Sub(boot))
	if want := []string{t0.Format(time.RFC3339Nano)}; !slices.Equal(pub.slots, want) {
		t.Errorf("published slots %v, want %v", pub.slots, want)
	}
}

// A scheduler starting with CatchUp and a Lookback holding more than
// maxScan slots publishes the MaxCatchUp most recent of them, not slots
// from the start of the Lookback.
func TestLongLookbackCatchesUpMostRecentSlots(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	pub := &keyRecorder{}
	s, err := periodic.New(pub, periodic.Options{Clock: c, Missed: periodic.CatchUp, Lookback: 48 * time.Hour, MaxCatchUp: 3},
		periodic.Job{Name: "tick", Schedule: every(t, time.Second), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, c)
	want := []string{
		t0.Add(-2 * time.Second).Format(time.RFC3339Nano),
		t0.Add(-time.Second).Format(time.RFC3339Nano),
		t0.Format(time.RFC3339Nano),
	}
	if !slices.Equal(pub.slots, want) {
		t.Errorf("published slots %v, want %v", pub.slots, want)
	}
}

// A schedule whose slots come in bursts ("* * * 1-3 * *": every second of
// the 1st to the 3rd of each month, 259 200 slots) and a wall clock that
// jumps from before a burst to weeks after it (a host resumed from suspend):
// the policies keep the most recent due slots, the end of the burst. The
// scan bound must not drop them all because the burst lies further back
// than its doubling search reached.
func TestBurstScheduleAfterLongJumpKeepsMostRecentSlots(t *testing.T) {
	start := time.Date(2026, 1, 31, 23, 59, 30, 0, time.UTC)
	end := time.Date(2026, 2, 3, 23, 59, 59, 0, time.UTC)
	for _, tc := range []struct {
		missed periodic.MissedPolicy
		keep   int
		now    time.Time
	}{
		{periodic.Skip, 1, time.Date(2026, 2, 20, 12, 0, 0, 0, time.UTC)},
		{periodic.CatchUp, 3, time.Date(2026, 2, 20, 12, 0, 0, 0, time.UTC)},
		// A doubling window that reaches back into the burst, holding
		// more than 100 000 of its slots.
		{periodic.Skip, 1, time.Date(2026, 2, 5, 20, 26, 40, 0, time.UTC)},
		{periodic.CatchUp, 3, time.Date(2026, 2, 5, 20, 26, 40, 0, time.UTC)},
	} {
		t.Run(tc.missed.String()+"/"+tc.now.Format(time.DateTime), func(t *testing.T) {
			c := periodic.NewFakeClock(start)
			pub := &keyRecorder{}
			s, err := periodic.New(pub, periodic.Options{Clock: c, Missed: tc.missed, MaxCatchUp: tc.keep}, periodic.Job{
				Name: "burst", Schedule: periodic.MustCron("* * * 1-3 * *"), Queue: "q",
			})
			if err != nil {
				t.Fatal(err)
			}
			drive(t, s, c, tc.now.Sub(start))
			var want []string
			for i := tc.keep - 1; i >= 0; i-- {
				want = append(want, end.Add(-time.Duration(i)*time.Second).Format(time.RFC3339Nano))
			}
			if !slices.Equal(pub.slots, want) {
				t.Errorf("published slots %v, want the %d most recent due: %v", pub.slots, tc.keep, want)
			}
		})
	}
}

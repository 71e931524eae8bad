package periodic_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berthq/berth/periodic"
	"github.com/berthq/berth/sdk"
)

// eventLog is a Publisher that logs each publish, and an OnPublish that
// logs each call, in one sequence.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(e string) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) Publish(_ context.Context, _ string, msgs ...*sdk.Message) error {
	for _, m := range msgs {
		l.add("publish " + m.Header(periodic.HeaderSlot)[11:19])
	}
	return nil
}

func (l *eventLog) onPublish(_ string, slot time.Time) {
	l.add("onpublish " + slot.Format(time.TimeOnly))
}

// OnPublish is called after each successful publish: a group of missed
// slots caught up after a pause (CatchUp) is reported as slots that come
// one by one are, each slot's call in schedule order before the job's next
// slot is published — not the whole group's calls once the last of it was
// published.
func TestCatchUpOnPublishPerPublishInScheduleOrder(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	l := &eventLog{}
	s, err := periodic.New(l, periodic.Options{Clock: c, Missed: periodic.CatchUp, MaxCatchUp: 3, OnPublish: l.onPublish},
		periodic.Job{Name: "j", Schedule: every(t, 10*time.Second), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, c, 10*time.Second, 35*time.Second) // :10, then :20 :30 :40 caught up at :45
	l.mu.Lock()
	got := l.events
	l.mu.Unlock()
	equal(t, "events", got, []string{
		"publish 00:00:10", "onpublish 00:00:10",
		"publish 00:00:20", "onpublish 00:00:20",
		"publish 00:00:30", "onpublish 00:00:30",
		"publish 00:00:40", "onpublish 00:00:40",
	})
}

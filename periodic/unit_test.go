package periodic_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/periodic"
	"github.com/berthq/berth/sdk"
)

// recorder is a Publisher that records what it is given and fails while
// failing is set (a broker outage a real server cannot be made to have on
// cue).
type recorder struct {
	mu      sync.Mutex
	msgs    []*sdk.Message
	failing bool
	calls   int
}

var errDown = errors.New("broker down")

func (r *recorder) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.failing {
		return errDown
	}
	if err := sdk.PrepareAll(ctx, queue, msgs, 0); err != nil {
		return err
	}
	r.msgs = append(r.msgs, msgs...)
	return nil
}

func (r *recorder) slots(t *testing.T) []string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		out = append(out, m.Header(periodic.HeaderSlot)[11:19])
	}
	return out
}

// drive runs s on c, advancing it by the given steps and waiting for s to
// sleep again after each.
func drive(t *testing.T, s *periodic.Scheduler, c *periodic.FakeClock, steps ...time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	for _, d := range steps {
		if err := c.WaitSleepers(wctx, 1); err != nil {
			t.Fatal(err)
		}
		c.Advance(d)
	}
	if err := c.WaitSleepers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func every(t *testing.T, d time.Duration) periodic.Schedule {
	t.Helper()
	s, err := periodic.Every(d, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: got %v, want %v", what, got, want)
		}
	}
}

// Skip publishes only the latest due slot after a long pause.
func TestSkipPublishesOnlyLatestMissedSlot(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	r := &recorder{}
	s, err := periodic.New(r, periodic.Options{Clock: c}, periodic.Job{Name: "j", Schedule: every(t, 10*time.Second), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, c, 10*time.Second, 45*time.Second, 5*time.Second)
	equal(t, "slots", r.slots(t), []string{"00:00:10", "00:00:50", "00:01:00"})
}

// CatchUp publishes missed slots oldest first, at most MaxCatchUp.
func TestCatchUpIsBounded(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	r := &recorder{}
	s, err := periodic.New(r, periodic.Options{Clock: c, Missed: periodic.CatchUp, MaxCatchUp: 3},
		periodic.Job{Name: "j", Schedule: every(t, 10*time.Second), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, c, 10*time.Second, 55*time.Second, 20*time.Second)
	equal(t, "slots", r.slots(t), []string{"00:00:10", "00:00:40", "00:00:50", "00:01:00", "00:01:10", "00:01:20"})
}

// A failing publish keeps the slot due and retries it with backoff; when the
// broker is back, the slot is published (CatchUp keeps the older one too).
func TestFailedPublishIsRetried(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	r := &recorder{failing: true}
	s, err := periodic.New(r, periodic.Options{Clock: c, Missed: periodic.CatchUp,
		Retry: sdk.Backoff{Base: 4 * time.Second, Max: 4 * time.Second, Jitter: -1}},
		periodic.Job{Name: "j", Schedule: every(t, 10*time.Second), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	for range 4 { // 0:00:10 fails, retried at :14 and :18 (fail), then :22 with :20 due too
		if err := c.WaitSleepers(wctx, 1); err != nil {
			t.Fatal(err)
		}
		if c.Now().Equal(t0.Add(18 * time.Second)) {
			r.mu.Lock()
			r.failing = false
			r.mu.Unlock()
		}
		if c.Now().Before(t0.Add(10 * time.Second)) {
			c.Advance(10 * time.Second)
		} else {
			c.Advance(4 * time.Second)
		}
	}
	if err := c.WaitSleepers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	equal(t, "slots", r.slots(t), []string{"00:00:10", "00:00:20"})
	if r.calls != 5 { // 0:00:10 failed at :10, :14 and :18; :10 and :20 published at :22
		t.Errorf("publish calls: %d, want 5", r.calls)
	}
}

// The message of a slot is the same in every scheduler: key, ID, type and
// headers are derived from the job's name and the slot; a Message func's
// fields are kept.
func TestSlotMessage(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	r := &recorder{}
	s, err := periodic.New(r, periodic.Options{Clock: c},
		periodic.Job{Name: "plain", Schedule: every(t, time.Minute), Queue: "q"},
		periodic.Job{Name: "custom", Schedule: every(t, time.Minute), Queue: "q", Message: func(slot time.Time) (*sdk.Message, error) {
			return &sdk.Message{Type: "report.daily", Body: []byte(slot.Format(time.DateOnly))}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, c, time.Minute)
	slot := t0.Add(time.Minute)
	if len(r.msgs) != 2 {
		t.Fatalf("%d messages, want 2", len(r.msgs))
	}
	byType := map[string]*sdk.Message{}
	for _, m := range r.msgs {
		byType[m.Type] = m
	}
	p, cu := byType["plain"], byType["report.daily"]
	if p == nil || cu == nil {
		t.Fatalf("types %v", byType)
	}
	if p.IdempotencyKey != "periodic:plain@2026-12-01T00:01:00Z" || p.ID != periodic.SlotID("plain", slot) {
		t.Errorf("plain: key %q id %q", p.IdempotencyKey, p.ID)
	}
	if cu.IdempotencyKey != periodic.SlotKey("custom", slot) || string(cu.Body) != "2026-12-01" {
		t.Errorf("custom: key %q body %q", cu.IdempotencyKey, cu.Body)
	}
	if cu.Header(periodic.HeaderSchedule) != "custom" || cu.Header(periodic.HeaderSlot) != "2026-12-01T00:01:00Z" {
		t.Errorf("headers %v", cu.Headers)
	}
	if periodic.SlotID("plain", slot) != periodic.SlotID("plain", slot.In(time.FixedZone("X", 3600))) {
		t.Error("SlotID depends on the slot's zone")
	}
}

func TestCronAndEvery(t *testing.T) {
	for _, tc := range []struct {
		expr string
		from time.Time
		want time.Time
	}{
		{"*/5 * * * *", t0.Add(time.Minute), t0.Add(5 * time.Minute)},
		{"*/10 * * * * *", t0.Add(time.Second), t0.Add(10 * time.Second)},
		{"@hourly", t0, t0.Add(time.Hour)},
		{"0 9 * * *", t0, t0.Add(9 * time.Hour)}, // UTC by default
		{"CRON_TZ=Europe/Paris 0 9 * * *", t0, t0.Add(8 * time.Hour)},
	} {
		s, err := periodic.Cron(tc.expr)
		if err != nil {
			t.Fatalf("%q: %v", tc.expr, err)
		}
		if got := s.Next(tc.from); !got.Equal(tc.want) {
			t.Errorf("%q.Next(%s) = %s, want %s", tc.expr, tc.from, got, tc.want)
		}
	}
	for _, bad := range []string{"", "* * *", "61 * * * *", "@every 1m", "@yearly-ish"} {
		if _, err := periodic.Cron(bad); !errors.Is(err, periodic.ErrInvalidSchedule) {
			t.Errorf("Cron(%q) = %v, want ErrInvalidSchedule", bad, err)
		}
	}
	e, err := periodic.Every(time.Hour, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Next(t0.Add(20 * time.Minute)); !got.Equal(t0.Add(75 * time.Minute)) {
		t.Errorf("Every(1h, 15m).Next(0:20) = %s", got)
	}
	if got := e.Next(t0.Add(15 * time.Minute)); !got.Equal(t0.Add(75 * time.Minute)) {
		t.Errorf("Next is not strictly after: %s", got)
	}
	before := time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC)
	if got := every(t, 10*time.Second).Next(before); !got.Equal(time.Unix(0, 0).UTC()) {
		t.Errorf("Every before the epoch: %s", got)
	}
	// An interval past MaxEvery (its slot plus offset overflowed
	// nanoseconds since 1970: the job stopped at run time) is refused too.
	const year = 365 * 24 * time.Hour
	for _, d := range [][2]time.Duration{{time.Millisecond, 0}, {time.Minute, -1}, {time.Minute, time.Minute},
		{200 * year, 150 * year}, {periodic.MaxEvery + 1, 0}} {
		if _, err := periodic.Every(d[0], d[1]); !errors.Is(err, periodic.ErrInvalidSchedule) {
			t.Errorf("Every(%s, %s) = %v", d[0], d[1], err)
		}
	}
}

func TestNewRefusesBadJobs(t *testing.T) {
	r := &recorder{}
	s := every(t, time.Minute)
	for name, jobs := range map[string][]periodic.Job{
		"no name":     {{Schedule: s, Queue: "q"}},
		"no schedule": {{Name: "j", Queue: "q"}},
		"bad queue":   {{Name: "j", Schedule: s, Queue: "no spaces"}},
		"twice":       {{Name: "j", Schedule: s, Queue: "q"}, {Name: "j", Schedule: s, Queue: "q2"}},
	} {
		if _, err := periodic.New(r, periodic.Options{}, jobs...); !errors.Is(err, periodic.ErrInvalidJob) {
			t.Errorf("%s: %v, want ErrInvalidJob", name, err)
		}
	}
	if _, err := periodic.New(nil, periodic.Options{}); !errors.Is(err, periodic.ErrInvalidJob) {
		t.Errorf("nil publisher: %v", err)
	}
	// Options it cannot follow: an unknown Missed policy ran as Skip.
	job := periodic.Job{Name: "j", Schedule: s, Queue: "q"}
	for name, o := range map[string]periodic.Options{
		"negative Lookback": {Lookback: -time.Second},
		"unknown Missed":    {Missed: periodic.CatchUp + 1},
		"negative Missed":   {Missed: -1},
	} {
		if _, err := periodic.New(r, o, job); !errors.Is(err, periodic.ErrInvalidJob) {
			t.Errorf("%s: %v, want ErrInvalidJob", name, err)
		}
	}
	for _, m := range []periodic.MissedPolicy{periodic.Skip, periodic.CatchUp} {
		if _, err := periodic.New(r, periodic.Options{Missed: m}, job); err != nil {
			t.Errorf("Missed %s: %v", m, err)
		}
	}
}

func TestRunTwiceIsRefused(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	s, err := periodic.New(&recorder{}, periodic.Options{Clock: c}, periodic.Job{Name: "j", Schedule: every(t, time.Minute), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	if err := c.WaitSleepers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Run(ctx); !errors.Is(err, periodic.ErrRunning) {
		t.Errorf("second Run: %v, want ErrRunning", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// "@every" is refused however it is written: after a time zone prefix or
// leading spaces robfig still reads it, with slots counted from the time it
// is asked, which two schedulers would not agree on.
func TestCronRefusesEveryBehindAPrefix(t *testing.T) {
	for _, expr := range []string{"@every 1m", "CRON_TZ=UTC @every 1m", " @every 1m", "TZ=UTC @every 1m", "CRON_TZ=Europe/Paris   @every 5m"} {
		if _, err := periodic.Cron(expr); !errors.Is(err, periodic.ErrInvalidSchedule) {
			t.Errorf("Cron(%q) = %v, want ErrInvalidSchedule", expr, err)
		}
	}
	for _, expr := range []string{"CRON_TZ=Europe/Paris 0 9 * * *", " 0 9 * * *", "@daily", "TZ=UTC @hourly"} {
		if _, err := periodic.Cron(expr); err != nil {
			t.Errorf("Cron(%q) = %v", expr, err)
		}
	}
}

// A time zone prefix with nothing after it is a typed error, not a panic
// inside robfig (which slices the zone up to a space that is not there),
// and an expression naming a day no month has is refused rather than
// giving a job that silently never runs.
func TestCronRefusesZoneAloneAndImpossibleDates(t *testing.T) {
	for _, expr := range []string{"CRON_TZ=UTC", "TZ=Europe/Paris", "CRON_TZ=", " CRON_TZ=UTC ", "0 0 30 2 *", "0 0 31 4 *", "CRON_TZ=Europe/Paris 0 9 31 11 *"} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Cron(%q) panicked: %v", expr, r)
				}
			}()
			if _, err := periodic.Cron(expr); !errors.Is(err, periodic.ErrInvalidSchedule) {
				t.Errorf("Cron(%q) = %v, want ErrInvalidSchedule", expr, err)
			}
		}()
	}
	// Rare but real dates stay valid.
	for _, expr := range []string{"0 0 29 2 *", "0 0 31 * *", "0 0 30 2 1"} {
		if _, err := periodic.Cron(expr); err != nil {
			t.Errorf("Cron(%q) = %v", expr, err)
		}
	}
}

// queueDown is a Publisher whose one queue fails (a queue-specific outage:
// a missing queue, a permission) while the others publish.
type queueDown struct {
	recorder
	down string
}

func (q *queueDown) Publish(ctx context.Context, queue string, msgs ...*sdk.Message) error {
	if queue == q.down {
		return errDown
	}
	return q.recorder.Publish(ctx, queue, msgs...)
}

// One job's failing publishes back off without holding back the slots of
// the other jobs: a healthy job's slot is published when it comes, not
// when the failing one's retry is due.
func TestFailingJobDoesNotDelayOthers(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	p := &queueDown{down: "bad"}
	s, err := periodic.New(p, periodic.Options{Clock: c, Retry: sdk.Backoff{Base: time.Hour, Max: time.Hour, Jitter: -1}},
		periodic.Job{Name: "failing", Schedule: every(t, time.Minute), Queue: "bad"},
		periodic.Job{Name: "healthy", Schedule: every(t, 10*time.Second), Queue: "good"})
	if err != nil {
		t.Fatal(err)
	}
	// 0:01:00 fails for "failing" (retry in an hour); "healthy" must
	// still publish 0:01:10 and 0:01:20 on time.
	drive(t, s, c, time.Minute, 10*time.Second, 10*time.Second)
	equal(t, "healthy slots", p.slots(t), []string{"00:01:00", "00:01:10", "00:01:20"})
}

// "CRON_TZ=Local" (or "TZ=Local") names no zone: robfig then reads the
// slots in the zone of the time it is asked about, the machine's for a
// RealClock. Schedulers on machines in different zones published one
// daily slot each at different instants, with different keys: the job ran
// once per zone. Before, Cron accepted it.
func TestCronRefusesLocalZone(t *testing.T) {
	for _, expr := range []string{"CRON_TZ=Local 0 9 * * *", "TZ=Local 0 9 * * *", " CRON_TZ=Local @daily"} {
		s, err := periodic.Cron(expr)
		if errors.Is(err, periodic.ErrInvalidSchedule) {
			continue
		}
		if err != nil {
			t.Errorf("Cron(%q) = %v, want ErrInvalidSchedule", expr, err)
			continue
		}
		tokyo := time.FixedZone("JST", 9*3600)
		at := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
		t.Errorf("Cron(%q) accepted: the same instant gives slot %s seen from UTC, %s seen from UTC+9",
			expr, s.Next(at).UTC(), s.Next(at.In(tokyo)).UTC())
	}
}

// A Name that is not valid UTF-8 is the Type, the idempotency key and a
// header of every message of the job, and every broker refuses such a
// message (sdk.Prepare): New accepted the job and its scheduler
// then retried each slot's publish forever, publishing nothing. It is now
// an ErrInvalidJob at New.
func TestNewRefusesNameNoMessageCanCarry(t *testing.T) {
	const name = "report\xff"
	b, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m := &sdk.Message{Type: name, IdempotencyKey: periodic.SlotKey(name, time.Unix(0, 0))}
	m.SetHeader(periodic.HeaderSchedule, name)
	var he *sdk.HeaderError
	if err := b.Publish(context.Background(), "q", m); !errors.As(err, &he) && !errors.Is(err, sdk.ErrInvalidMessage) {
		t.Fatalf("the broker took a message of job %q: %v", name, err)
	}
	if _, err := periodic.New(b, periodic.Options{}, periodic.Job{Name: name, Schedule: every(t, time.Minute), Queue: "q"}); !errors.Is(err, periodic.ErrInvalidJob) {
		t.Errorf("New(job %q) = %v, want ErrInvalidJob: none of its slots can be published", name, err)
	}
}

// jumpClock is a wall clock that can jump ahead of the time timers count
// (a host resumed from suspend, a VM restored, a clock stepped by NTP):
// Sleep waits on the embedded FakeClock, the elapsed time, and Now is its
// time plus the jumps. A real clock cannot be made to jump on cue. It
// embeds the FakeClock, as a Clock wrapping one should, so that its
// WaitSleepers counts the scheduler's publishes as work.
type jumpClock struct {
	*periodic.FakeClock
	mu   sync.Mutex
	jump time.Duration
}

func (c *jumpClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeClock.Now().Add(c.jump)
}

func (c *jumpClock) Jump(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.jump += d
}

// The scheduler slept until the next slot as the timer counts it: when
// the wall clock jumped a day ahead during that sleep (the host suspended
// overnight), the slot that came due with the jump waited for the rest of
// the day's sleep, a day late. It now reads the clock at least every
// minute.
func TestSlotDueAfterWallClockJumpIsPublished(t *testing.T) {
	c := &jumpClock{FakeClock: periodic.NewFakeClock(t0.Add(time.Hour))}
	r := &recorder{}
	s, err := periodic.New(r, periodic.Options{Clock: c}, periodic.Job{Name: "daily", Schedule: every(t, 24*time.Hour), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := c.FakeClock.WaitSleepers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	c.Jump(24 * time.Hour) // 01:00 on day 1 → 01:00 on day 2, past the slot at 00:00
	c.FakeClock.Advance(time.Minute)
	if err := c.FakeClock.WaitSleepers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.msgs) != 1 {
		t.Fatalf("published %d messages a minute after the wall clock passed the slot, want 1 (the slot of %s)",
			len(r.msgs), t0.Add(24*time.Hour))
	}
	if got, want := r.msgs[0].Header(periodic.HeaderSlot), t0.Add(24*time.Hour).Format(time.RFC3339Nano); got != want {
		t.Errorf("published slot %s, want %s", got, want)
	}
}

// A wall clock stepped back (NTP correcting a clock that ran fast) after a
// slot was published puts that slot in the future again: the scheduler,
// now reading the clock every minute, must not publish it a second time
// when the clock reaches it again; it goes on to the next slot.
func TestSlotNotRepublishedAfterWallClockStepsBack(t *testing.T) {
	c := &jumpClock{FakeClock: periodic.NewFakeClock(t0.Add(-30 * time.Minute))}
	r := &recorder{}
	s, err := periodic.New(r, periodic.Options{Clock: c}, periodic.Job{Name: "hourly", Schedule: every(t, time.Hour), Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	step := func(d time.Duration) {
		t.Helper()
		if err := c.FakeClock.WaitSleepers(wctx, 1); err != nil {
			t.Fatal(err)
		}
		c.FakeClock.Advance(d)
	}
	for range 31 { // to 00:01, past the slot at 00:00
		step(time.Minute)
	}
	if err := c.FakeClock.WaitSleepers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	c.Jump(-30 * time.Minute) // back to 23:31 the day before
	for range 89 {            // to 01:00 on the wall clock, through 00:00 again
		step(time.Minute)
	}
	if err := c.FakeClock.WaitSleepers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var slots []string
	for _, m := range r.msgs {
		slots = append(slots, m.Header(periodic.HeaderSlot))
	}
	want := []string{t0.Format(time.RFC3339Nano), t0.Add(time.Hour).Format(time.RFC3339Nano)}
	if !slices.Equal(slots, want) {
		t.Errorf("published slots %v, want %v: each once, the clock stepping back notwithstanding", slots, want)
	}
}

// A slot whose message the publisher refuses as invalid (sdk.Prepare's
// ErrInvalidMessage: here a delay beyond sdk.MaxDelay) will be refused
// again: it is dropped, and the job's later slots go out when they come.
// Before, it was retried with backoff, oldest first, holding back every
// later slot of the job — with CatchUp until MaxCatchUp newer slots had
// piled up behind it (ten days for a daily job).
func TestRefusedSlotDoesNotHoldBackLaterSlots(t *testing.T) {
	c := periodic.NewFakeClock(t0)
	r := &recorder{}
	bad := t0.Add(20 * time.Second)
	s, err := periodic.New(r, periodic.Options{Clock: c, Missed: periodic.CatchUp,
		Retry: sdk.Backoff{Base: time.Hour, Max: time.Hour, Jitter: -1}},
		periodic.Job{Name: "j", Schedule: every(t, 10*time.Second), Queue: "q",
			Message: func(slot time.Time) (*sdk.Message, error) {
				m := &sdk.Message{}
				if slot.Equal(bad) {
					m.Delay = sdk.MaxDelay + time.Hour
				}
				return m, nil
			}})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, c, 10*time.Second, 10*time.Second, 10*time.Second, 10*time.Second)
	equal(t, "slots", r.slots(t), []string{"00:00:10", "00:00:30", "00:00:40"})
	if r.calls != 4 { // :20 tried once, not retried
		t.Errorf("publish calls: %d, want 4", r.calls)
	}
}

// stuckSchedule is a broken Schedule whose Next does not advance: it returns
// t itself (same) or a time before t. It counts its calls and, past limit,
// ends the schedule (the zero time), so that a scheduler that keeps calling
// it — spinning at full CPU — stops and the test can fail rather than hang.
type stuckSchedule struct {
	calls   atomic.Int64
	limit   int64
	earlier bool
}

func (s *stuckSchedule) Next(t time.Time) time.Time {
	if s.calls.Add(1) > s.limit {
		return time.Time{}
	}
	if s.earlier {
		return t.Add(-time.Hour)
	}
	return t
}

// A Schedule whose Next does not advance stops its job (logged at Error),
// rather than spinning the scheduler; the other jobs keep their slots.
func TestNonAdvancingScheduleStopsItsJob(t *testing.T) {
	for _, earlier := range []bool{false, true} {
		name := map[bool]string{false: "same", true: "earlier"}[earlier]
		t.Run(name, func(t *testing.T) {
			c := periodic.NewFakeClock(t0)
			r := &recorder{}
			stuck := &stuckSchedule{limit: 1_000_000, earlier: earlier}
			var logs strings.Builder
			var logMu sync.Mutex
			logger := slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logs}, nil))
			s, err := periodic.New(r, periodic.Options{Clock: c, Logger: logger},
				periodic.Job{Name: "stuck", Schedule: stuck, Queue: "q"},
				periodic.Job{Name: "ok", Schedule: every(t, 10*time.Second), Queue: "q"})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer wcancel()
			for range 2 {
				if err := c.WaitSleepers(wctx, 1); err != nil {
					t.Fatal(err)
				}
				c.Advance(10 * time.Second)
			}
			if err := c.WaitSleepers(wctx, 1); err != nil {
				t.Fatal(err)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if n := stuck.calls.Load(); n > 10 {
				t.Fatalf("the broken schedule's Next was called %d times: the scheduler spun on it", n)
			}
			equal(t, "slots", r.slots(t), []string{"00:00:10", "00:00:20"})
			logMu.Lock()
			out := logs.String()
			logMu.Unlock()
			if strings.Count(out, "did not advance") != 1 || !strings.Contains(out, "schedule=stuck") || !strings.Contains(out, "level=ERROR") {
				t.Fatalf("want one Error naming the stuck schedule, got:\n%s", out)
			}
		})
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

package periodic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/berthq/berth/sdk"
)

// Header names the scheduler sets on every message it publishes. They are
// application headers (not berth-reserved), so a message built by hand with
// them passes [sdk.Prepare].
const (
	// HeaderSchedule carries the Job's Name.
	HeaderSchedule = "periodic-schedule"
	// HeaderSlot carries the slot time, RFC 3339 in UTC.
	HeaderSlot = "periodic-slot"
)

// Job is one periodic job: a message published to Queue for every slot of
// Schedule.
type Job struct {
	// Name identifies the schedule; with the slot time it makes each slot's
	// idempotency key ([SlotKey]). Every scheduler of the same job must use
	// the same Name; renaming a job makes its slots new operations. It must
	// be valid UTF-8.
	Name string
	// Schedule gives the slots ([Cron], [Every]).
	Schedule Schedule
	// Queue receives the messages.
	Queue string
	// Message builds the message of a slot. nil, or a message with an empty
	// field, is completed by the scheduler: Type defaults to Name,
	// IdempotencyKey to [SlotKey](Name, slot) and ID to a UUID derived from
	// that key, so every scheduler publishes the same message for a slot.
	// Message must depend on the slot only (not on the time it is called or
	// the process): it runs in every scheduler, and for a slot caught up
	// after downtime, late. A slot whose Message returns an error, or whose
	// message the publisher refuses as invalid (an error wrapping
	// sdk.ErrInvalidMessage, sdk.ErrInvalidHeader or sdk.ErrMessageTooLarge),
	// is dropped and logged at Error rather than retried: it would be
	// refused again, and would hold back the job's later slots.
	Message func(slot time.Time) (*sdk.Message, error)
}

// MissedPolicy says what a scheduler does with slots that passed while it
// could not publish them: the process was down (see Options.Lookback), or
// paused, or publishing failed for longer than a slot.
type MissedPolicy int

const (
	// Skip publishes only the latest due slot and drops the older ones
	// (for jobs where only the current state matters: a refresh, a sweep).
	Skip MissedPolicy = iota
	// CatchUp publishes the due slots oldest first, at most
	// Options.MaxCatchUp of them (the most recent); older ones are dropped
	// and logged (for jobs whose every slot matters: a daily report).
	CatchUp
)

// Options configures a [Scheduler]. The zero value is usable.
type Options struct {
	// Clock is the scheduler's time. Default [RealClock].
	Clock Clock
	// Missed is the policy for missed slots. Default [Skip].
	Missed MissedPolicy
	// MaxCatchUp bounds the slots CatchUp publishes at once. Default 10.
	MaxCatchUp int
	// Lookback, with CatchUp, is how far back a scheduler that starts looks
	// for missed slots: those in (start−Lookback, start] are due at once.
	// Slots that other schedulers already published are published again
	// with the same key and ID, which the broker's publish dedupe or the
	// consumer's idempotency guard absorbs. Default 0: a scheduler starts
	// with the first slot after its start.
	Lookback time.Duration
	// PublishTimeout bounds each Publish. Default 30s. It is time of the
	// Clock, as the slots and the Retry delays are: with RealClock the
	// Publish's ctx has that deadline; with a FakeClock an Advance past it
	// ends the ctx (Err context.DeadlineExceeded; no Deadline, since the
	// fake time is not the wall clock's), so that a test drives a hung
	// publish to its timeout without waiting.
	PublishTimeout time.Duration
	// Retry spaces the attempts of a job's failing Publish (the other
	// jobs' slots are published between them). Default 1s doubling up to
	// 1m, with 50% jitter. The slots stay due meanwhile (subject to
	// the Missed policy once newer slots come). Each job publishes on its
	// own, one publish in flight at a time: an attempt that hangs until
	// PublishTimeout (a queue whose broker never confirms, while other
	// queues' publishes go through) holds up only its own job, whose
	// slots that come due meanwhile stay due under the Missed policy; the
	// other jobs' slots are published when they come.
	Retry sdk.Backoff
	// Logger receives warnings of failed publishes and dropped slots.
	// Default slog.Default().
	Logger *slog.Logger
	// OnPublish, optional, is called after each successful publish with the
	// job's name and the slot (metrics, tests), from Run's goroutine, one
	// call at a time. A job's slots are published one at a time, oldest
	// first, and each one's call comes before the job's next slot is
	// published: slots caught up together (CatchUp, after a pause or a
	// restart with Lookback, or after failed publishes) are reported one
	// by one in schedule order, as slots that come due one by one are.
	// The calls of different jobs interleave as their publishes end.
	OnPublish func(name string, slot time.Time)
}

// Scheduler publishes the messages of periodic jobs, one per slot.
//
// Several schedulers (one per process, for availability) may run the same
// jobs: each publishes every slot, with the same idempotency key and ID, so
// the slot's job runs once in effect — deduplicated at publish where the
// broker can (JetStream within its Duplicates window, PostgreSQL with
// DedupeEnqueue, SQS FIFO within 5 minutes) and else by the consumer's
// idempotency guard (memory, RabbitMQ, SQS standard), which must wrap the
// handler. See ARCHITECTURE.md, "Periodic jobs".
type Scheduler struct {
	pub     sdk.Publisher
	jobs    []Job
	o       Options
	rnd     *rand.Rand // used by the one Run
	running atomic.Bool
}

// ErrRunning is returned by Run when the Scheduler already runs. Run more
// schedulers (one per process) for availability, not more Runs of one.
var ErrRunning = errors.New("berth/periodic: scheduler already running")

// MaxNameLength is the longest [Job] Name, in bytes, that New accepts. The
// Name is each slot's message Type, which RabbitMQ carries in an AMQP short
// string of at most 255 bytes: a longer one could be published to no
// broker berth supports alike, and its every slot would be dropped at run
// time instead of refused once at New.
const MaxNameLength = 255

// ErrInvalidJob reports a Job that cannot be scheduled.
var ErrInvalidJob = errors.New("berth/periodic: invalid job")

// New returns a Scheduler that publishes jobs through pub. It returns an
// error wrapping [ErrInvalidJob] for a job without name, schedule or valid
// queue, with a name that is not valid UTF-8, holds a NUL or is longer than
// [MaxNameLength] (a broker would refuse every one of its slots), for
// two jobs with the same name, and for options it cannot follow (a
// negative Lookback, a Missed policy that is neither [Skip] nor [CatchUp]).
func New(pub sdk.Publisher, opts Options, jobs ...Job) (*Scheduler, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: nil publisher", ErrInvalidJob)
	}
	names := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		if j.Name == "" || j.Schedule == nil {
			return nil, fmt.Errorf("%w: %q: a job needs a Name and a Schedule", ErrInvalidJob, j.Name)
		}
		if !utf8.ValidString(j.Name) {
			// The Name is each message's Type, idempotency key and
			// HeaderSchedule: no broker takes one that is not UTF-8
			// (sdk.Prepare), so no slot could ever be published.
			return nil, fmt.Errorf("%w: %q: the Name must be valid UTF-8", ErrInvalidJob, j.Name)
		}
		if len(j.Name) > MaxNameLength {
			// RabbitMQ carries the Type in an AMQP short string: every
			// slot would be refused at publish, logged, and never run.
			return nil, fmt.Errorf("%w: %.32q…: a Name of %d bytes, above MaxNameLength (%d)", ErrInvalidJob, j.Name, len(j.Name), MaxNameLength)
		}
		if strings.IndexByte(j.Name, 0) >= 0 {
			// PostgreSQL refuses NUL in text: the broker's row, the
			// idempotency key's and the ledger's could never be written.
			return nil, fmt.Errorf("%w: %q: the Name must not contain NUL", ErrInvalidJob, j.Name)
		}
		if err := sdk.ValidateQueueName(j.Queue); err != nil {
			return nil, fmt.Errorf("%w: %q: %w", ErrInvalidJob, j.Name, err)
		}
		if names[j.Name] {
			return nil, fmt.Errorf("%w: %q scheduled twice", ErrInvalidJob, j.Name)
		}
		names[j.Name] = true
	}
	if opts.Clock == nil {
		opts.Clock = RealClock{}
	}
	if opts.MaxCatchUp <= 0 {
		opts.MaxCatchUp = 10
	}
	if opts.Lookback < 0 {
		return nil, fmt.Errorf("%w: negative Lookback", ErrInvalidJob)
	}
	if opts.Missed != Skip && opts.Missed != CatchUp {
		// A policy of a newer berth, or a stray conversion: run as Skip,
		// a CatchUp meant would drop every missed slot but the last.
		return nil, fmt.Errorf("%w: unknown Missed policy %s", ErrInvalidJob, opts.Missed)
	}
	if opts.PublishTimeout <= 0 {
		opts.PublishTimeout = 30 * time.Second
	}
	if opts.Retry == (sdk.Backoff{}) {
		opts.Retry = sdk.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.5}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Scheduler{pub: pub, jobs: append([]Job(nil), jobs...), o: opts,
		rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}, nil
}

// SlotKey is the idempotency key of a job's slot: "periodic:" + name + "@"
// + the slot in RFC 3339, UTC.
func SlotKey(name string, slot time.Time) string {
	return "periodic:" + name + "@" + slot.UTC().Format(time.RFC3339Nano)
}

// slotNamespace derives message IDs from slot keys (UUIDv5).
var slotNamespace = uuid.MustParse("6f1b8e2a-4c1d-5e3f-9a7b-0c2d4e6f8a10")

// SlotID is the message ID the scheduler gives a slot whose message has no
// ID: a UUIDv5 of [SlotKey], the same in every scheduler.
func SlotID(name string, slot time.Time) string {
	return uuid.NewSHA1(slotNamespace, []byte(SlotKey(name, slot))).String()
}

// state is one job's progress in a Run.
type state struct {
	job     Job
	cursor  time.Time   // slots after cursor are not yet published
	pending []time.Time // due slots not yet published (failed publishes)
	done    bool        // the schedule has no more slots
	// failures counts the job's publishes failed in a row; its pending
	// slots wait until retryAt (Options.Retry), the other jobs do not.
	failures int
	retryAt  time.Time
	// inflight is set while a publish of the job runs: its slot is out
	// of pending, and the job starts no other publish until Run has
	// taken the result.
	inflight bool
}

// outgoing is a slot and its message, as a job's publish is given them.
type outgoing struct {
	slot time.Time
	msg  *sdk.Message
}

// flight is the result of one publish of a job's slots (see launch).
type flight struct {
	st        *state
	w         *work       // the publish's work on a FakeClock, ended by Run
	published []time.Time // the slot published, if it was
	unsent    []time.Time // the slot a failed Publish left, if it failed
	// panicked holds what the Publish panicked with, raised again on Run's
	// goroutine (land), as when Run called Publish itself: a panic on the
	// publish's own goroutine would end the process, past any recover of
	// Run's caller.
	panicked any
}

// flights are the publishes a Run has started and not yet taken back.
type flights struct {
	n       int         // started, not yet taken
	results chan flight // one per job at most: never blocks a publish
	mu      sync.Mutex
	cancel  context.CancelFunc // ends Run's current sleep; nil while awake
}

// done reports a publish's result and wakes Run if it sleeps.
func (f *flights) done(r flight) {
	f.results <- r
	f.mu.Lock()
	if f.cancel != nil {
		f.cancel()
	}
	f.mu.Unlock()
}

// sleep sleeps on c for d, or until a publish reports or ctx is done,
// and returns ctx.Err().
func (f *flights) sleep(ctx context.Context, c Clock, d time.Duration) error {
	f.mu.Lock()
	if len(f.results) > 0 { // reported since Run looked
		f.mu.Unlock()
		return ctx.Err()
	}
	sctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	f.mu.Unlock()
	_ = c.Sleep(sctx, d)
	f.mu.Lock()
	f.cancel = nil
	f.mu.Unlock()
	cancel()
	return ctx.Err()
}

// Run publishes slots until ctx is done, then returns nil once the
// publishes it started have ended. It returns only on ctx (or
// [ErrRunning]): a failing Publish is retried (Options.Retry) and logged.
//
// Each job's due slots are published in a goroutine of Run's, one publish
// in flight per job, so that a job whose Publish hangs (until
// PublishTimeout) does not hold up the others: while it is in flight, its
// job's newer slots stay due under Options.Missed and the other jobs'
// slots are published when they come. A Publish that panics makes Run
// panic with its value, on the goroutine that called Run, once the other
// publishes in flight have ended (their ctx is cancelled).
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer s.running.Store(false)
	wc, _ := s.o.Clock.(workClock)
	begin := func() *work {
		if wc == nil {
			return nil
		}
		return wc.beginWork()
	}
	loop := begin() // this loop's work, idle while it sleeps on the clock
	defer loop.end()
	ctx = withWork(ctx, loop)
	// The publishes end with pctx: ctx, or Run panicking (a Publish's panic
	// raised again in land), which must not wait for the others to end by
	// themselves.
	pctx, pcancel := context.WithCancel(ctx)
	fl := &flights{results: make(chan flight, len(s.jobs))}
	defer func() {
		pcancel()
		for fl.n > 0 { // ctx is done (or Run panics): the publishes end with pctx
			s.land(<-fl.results, fl, true)
		}
	}()
	now := s.o.Clock.Now()
	start := now
	if s.o.Missed == CatchUp {
		start = now.Add(-s.o.Lookback)
	}
	states := make([]*state, len(s.jobs))
	for i, j := range s.jobs {
		states[i] = &state{job: j, cursor: start}
	}
	for {
		for taken := false; !taken; {
			select {
			case r := <-fl.results:
				s.land(r, fl, false)
			default:
				taken = true
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		now = s.o.Clock.Now()
		for _, st := range states {
			s.collect(st, now)
			if st.inflight || len(st.pending) == 0 || now.Before(st.retryAt) {
				continue
			}
			s.launch(pctx, fl, st, begin())
		}
		next, ok := s.nextSlot(states)
		for _, st := range states {
			if !st.inflight && len(st.pending) > 0 && (!ok || st.retryAt.Before(next)) {
				next, ok = st.retryAt, true
			}
		}
		if !ok && fl.n == 0 {
			loop.end()   // its work is done
			<-ctx.Done() // nothing left to schedule
			return nil
		}
		// At most maxSleep at a time: a timer counts elapsed (monotonic)
		// time, and the slots are wall-clock times, so after the wall clock
		// jumps ahead — a host resumed from suspend, a VM restored or
		// migrated, a clock stepped by NTP — a sleep computed before would
		// publish the due slots as late as the jump. A publish that ends
		// wakes Run.
		d := maxSleep
		if ok {
			d = min(next.Sub(s.o.Clock.Now()), maxSleep)
		}
		if err := fl.sleep(ctx, s.o.Clock, d); err != nil {
			return nil
		}
	}
}

// launch starts the publish of st's oldest pending slot in a goroutine
// that Run waits for; w is its work on a FakeClock. The slot leaves
// pending until Run takes the result (land), and the job's next slot is
// launched only then: a job's slots are published one at a time, oldest
// first, each reported to OnPublish before the next is published — a
// group of missed slots caught up as slots that come one by one are.
// Slots whose message cannot be built are dropped here: they will not
// build later.
func (s *Scheduler) launch(ctx context.Context, fl *flights, st *state, w *work) {
	var o outgoing
	built := false
	i := 0
	for ; i < len(st.pending) && !built; i++ {
		slot := st.pending[i]
		m, err := s.message(st.job, slot)
		if err != nil {
			s.o.Logger.Error("berth/periodic: building the slot's message failed; slot dropped", "schedule", st.job.Name, "slot", slot.UTC(), "err", err)
			continue
		}
		o, built = outgoing{slot: slot, msg: m}, true
	}
	st.pending = append(st.pending[:0], st.pending[i:]...)
	if !built {
		w.end()
		return
	}
	st.inflight = true
	fl.n++
	job := st.job
	go func() {
		var r flight
		defer func() {
			if p := recover(); p != nil {
				r = flight{panicked: p}
			}
			r.st, r.w = st, w
			fl.done(r)
		}()
		r = s.publish(withWork(ctx, w), job, o)
	}()
}

// land takes the result of a job's publish, in Run's goroutine: it calls
// OnPublish for the slots published and, when a Publish failed, backs off
// this job only (a job whose publishes fail — its queue gone, a
// permission, a broker that never confirms — must not hold back the slots
// of the others) and puts the slots left back before the job's newer ones,
// under the Missed policy — unless Run is stopping.
func (s *Scheduler) land(r flight, fl *flights, stopping bool) {
	defer r.w.end()
	fl.n--
	st := r.st
	st.inflight = false
	if r.panicked != nil {
		panic(r.panicked) // on Run's goroutine, as before publishes ran beside it
	}
	if s.o.OnPublish != nil {
		for _, slot := range r.published {
			s.o.OnPublish(st.job.Name, slot)
		}
	}
	if len(r.unsent) == 0 {
		st.failures, st.retryAt = 0, time.Time{}
		return
	}
	if stopping {
		return
	}
	st.failures++
	st.retryAt = s.o.Clock.Now().Add(s.o.Retry.Delay(st.failures, s.rnd.Float64()))
	st.pending = append(r.unsent, st.pending...)
	if n := len(st.pending) - s.keep(); n > 0 {
		s.o.Logger.Warn("berth/periodic: dropping missed slots", "schedule", st.job.Name,
			"policy", s.o.Missed.String(), "dropped", n, "from", st.pending[0].UTC(), "to", st.pending[n-1].UTC())
		st.pending = append(st.pending[:0], st.pending[n:]...)
	}
}

// maxSleep bounds one sleep of Run between two reads of the clock: a slot
// due after the wall clock jumped ahead is published at most maxSleep late.
const maxSleep = time.Minute

// nextSlot returns the earliest next slot of the jobs.
func (s *Scheduler) nextSlot(states []*state) (time.Time, bool) {
	var next time.Time
	for _, st := range states {
		n, ok := s.next(st)
		if !ok {
			continue
		}
		if next.IsZero() || n.Before(next) {
			next = n
		}
	}
	return next, !next.IsZero()
}

// next returns st's first slot after its cursor, or false when the job has
// no more slots: its Schedule returned the zero time, or broke its contract
// by returning a time not after the cursor. Such a Next would name the same
// slot (or an earlier one) for ever, and Run would spin on it at full CPU;
// the job is stopped instead, and that is logged at Error once (the slots
// already due are still published; the other jobs go on).
func (s *Scheduler) next(st *state) (time.Time, bool) {
	if st.done {
		return time.Time{}, false
	}
	n := st.job.Schedule.Next(st.cursor)
	if n.IsZero() {
		st.done = true
		return time.Time{}, false
	}
	if !n.After(st.cursor) {
		st.done = true
		s.o.Logger.Error("berth/periodic: the schedule's Next did not advance; job stopped", "schedule", st.job.Name,
			"after", st.cursor.UTC(), "next", n.UTC(),
			"err", fmt.Errorf("%w: Next must return a time after the one it is given, or the zero time", ErrInvalidSchedule))
		return time.Time{}, false
	}
	return n, true
}

// maxScan bounds the slots collect walks in one call: a one-second schedule
// after a week of downtime would otherwise walk 600 000 slots.
const maxScan = 100_000

// collect adds st's slots due at now to its pending list and applies the
// missed-slot policy.
func (s *Scheduler) collect(st *state, now time.Time) {
	if st.done {
		return
	}
	scanned, dropped := 0, 0
	var droppedFrom, droppedTo time.Time
	drop := func(k int) { // drops all but the k newest pending slots
		if n := len(st.pending) - k; n > 0 {
			if dropped == 0 {
				droppedFrom = st.pending[0]
			}
			droppedTo = st.pending[n-1]
			dropped += n
			st.pending = append(st.pending[:0], st.pending[n:]...)
		}
	}
	keep := s.keep()
	for {
		n, ok := s.next(st)
		if !ok {
			break
		}
		if n.After(now) {
			break
		}
		st.pending = append(st.pending, n)
		st.cursor = n
		if scanned++; scanned%maxScan == 0 {
			// Jump ahead, to where the policy's keep newest due slots
			// begin: the slots taken and those in between are dropped
			// (the policies keep the most recent). A schedule too
			// irregular for that is jumped to now after another maxScan
			// slots. Never back to a slot already taken (n == now),
			// which would be collected again.
			c := now.Add(-time.Nanosecond)
			if scanned == maxScan {
				// Zero (walk on) when fewer than keep slots are left.
				c = s.recentFrom(st, now, keep)
			}
			if c.After(st.cursor) {
				drop(0)
				st.cursor = c
				dropped++ // at least; the count is a lower bound from here
			}
		}
		if len(st.pending) > 2*keep {
			drop(keep)
		}
	}
	drop(keep)
	if dropped > 0 {
		s.o.Logger.Warn("berth/periodic: dropping missed slots", "schedule", st.job.Name,
			"policy", s.o.Missed.String(), "dropped", dropped, "from", droppedFrom.UTC(), "to", droppedTo.UTC())
	}
}

// recentFrom returns a time after st.cursor from which st's schedule has
// keep slots up to now, or the zero time when there are fewer: collect
// walks on from there after a pause too long to walk. It searches back
// from now by doubling windows, up to the span (st.cursor, now], then
// bisects between the last window too short and the first long enough, so
// that the walk after takes keep slots, not all those of a window that
// reaches into a burst of slots (a seconds cron for some days a month):
// past maxScan of them, collect would jump to now and drop them all. Each
// step costs at most keep Next calls.
func (s *Scheduler) recentFrom(st *state, now time.Time, keep int) time.Time {
	keep = min(keep, maxScan/2) // bounds the Next calls, and the walk after
	enough := func(c time.Time) bool {
		n := 0
		for t := c; n < keep; n++ {
			next := st.job.Schedule.Next(t)
			if next.IsZero() || !next.After(t) || next.After(now) {
				break // the walk itself stops a Schedule that breaks its contract
			}
			t = next
		}
		return n >= keep
	}
	// (short, now] has fewer than keep slots, (long, now] at least keep.
	short, long := now, st.cursor
	span := now.Sub(st.cursor)
	for w := time.Nanosecond; w > 0 && w < span; w *= 2 { // w > 0: stop if it overflows
		c := now.Add(-w)
		if enough(c) {
			long = c
			break
		}
		short = c
	}
	if long.Equal(st.cursor) && !enough(st.cursor) {
		return time.Time{} // fewer than keep: the walk takes them all
	}
	for short.Sub(long) > time.Nanosecond {
		if mid := long.Add(short.Sub(long) / 2); enough(mid) {
			long = mid
		} else {
			short = mid
		}
	}
	if !long.After(st.cursor) {
		return time.Time{}
	}
	return long
}

// keep is how many due slots the policy publishes at once.
func (s *Scheduler) keep() int {
	if s.o.Missed == CatchUp {
		return s.o.MaxCatchUp
	}
	return 1
}

// String names the policy.
func (p MissedPolicy) String() string {
	switch p {
	case Skip:
		return "skip"
	case CatchUp:
		return "catch_up"
	}
	return fmt.Sprintf("MissedPolicy(%d)", int(p))
}

// publish publishes one slot of a job; it runs in a goroutine of Run's
// (launch).
func (s *Scheduler) publish(ctx context.Context, j Job, o outgoing) flight {
	var r flight
	pctx, cancel := s.withTimeout(ctx, s.o.PublishTimeout)
	err := s.pub.Publish(pctx, j.Queue, o.msg)
	cancel()
	switch {
	case err != nil && refused(err):
		// The message itself is invalid (sdk.Prepare's refusal): it
		// would be refused again, and retrying it, oldest first, would
		// hold back every later slot of the job.
		s.o.Logger.Error("berth/periodic: the publisher refused the slot's message; slot dropped", "schedule", j.Name, "slot", o.slot.UTC(), "err", err)
	case err != nil:
		if ctx.Err() == nil {
			s.o.Logger.Warn("berth/periodic: publish failed; will retry", "schedule", j.Name, "slot", o.slot.UTC(), "err", err)
		}
		r.unsent = []time.Time{o.slot}
	default:
		r.published = []time.Time{o.slot}
	}
	return r
}

// withTimeout returns ctx bounded by d of the scheduler's clock: a
// deadline with [RealClock]; on a [FakeClock] (or a Clock embedding one),
// a timer that Advance fires; on any other Clock, a Sleep of d on it.
func (s *Scheduler) withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	switch c := s.o.Clock.(type) {
	case RealClock, *RealClock:
		return context.WithTimeout(ctx, d)
	case workClock:
		return c.timeout(ctx, d)
	default:
		return clockTimeout(ctx, c, d)
	}
}

// refused reports a Publish error that refuses the message itself (see
// [sdk.Prepare]), which no retry changes.
func refused(err error) bool {
	return errors.Is(err, sdk.ErrInvalidMessage) || errors.Is(err, sdk.ErrInvalidHeader) || errors.Is(err, sdk.ErrMessageTooLarge)
}

// message builds the message of one slot (see Job.Message).
func (s *Scheduler) message(j Job, slot time.Time) (*sdk.Message, error) {
	var m *sdk.Message
	if j.Message != nil {
		var err error
		if m, err = j.Message(slot); err != nil {
			return nil, err
		}
		if m != nil {
			// Complete a copy: a Message func may return the same
			// template for every slot, which must not keep the first
			// slot's key, ID and headers.
			m = m.Clone()
		}
	}
	if m == nil {
		m = &sdk.Message{}
	}
	if m.Type == "" {
		m.Type = j.Name
	}
	if m.IdempotencyKey == "" {
		m.IdempotencyKey = SlotKey(j.Name, slot)
	}
	if m.ID == "" {
		m.ID = SlotID(j.Name, slot)
	}
	m.SetHeader(HeaderSchedule, j.Name)
	m.SetHeader(HeaderSlot, slot.UTC().Format(time.RFC3339Nano))
	return m, nil
}

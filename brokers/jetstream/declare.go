package jetstream

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/sdk"
)

// Consumer names: one durable pull consumer per subject, shared by every
// Broker that receives from the queue (work-queue retention allows one
// consumer per subject).
const (
	consumerName      = "berth"
	delayConsumerName = "berth-delay"
)

// delayAckWait is the delay consumer's AckWait: the lease of the mover on
// a delayed message. [Options.Duplicates] is at least twice it.
const delayAckWait = time.Minute

// queueState is what a Broker knows of a declared queue.
type queueState struct {
	name    string // berth queue name
	stream  string // BERTH_Q_<esc>
	dlq     string // BERTH_DLQ_<esc>
	ready   string // berth.q.<esc>
	delayed string // berth.d.<esc>
	dead    string // berth.dlq.<esc> (a dead letter's subject adds .<id token>)
	lock    string // BERTH_LOCK_<esc>: the lock of declarations (declareLock)
	// lockSubject is the lock stream's subject, berth.lock.<esc>.
	lockSubject string
	// ackWaitOK is set once Receive (with NoDeclare) has found the ready
	// consumer's AckWait no shorter than the Broker's.
	ackWaitOK atomic.Bool
	// suspect is set when a PublishAsync to the queue found no stream to
	// answer (suspectGone), or a pull no consumer (Receive): queue looks
	// them up before using the queue again (recheck).
	suspect atomic.Bool
}

// escape maps a queue name (letters, digits, '_', '-', '.') onto the
// characters a stream name and a subject token allow, one to one: '_'
// becomes "__" and '.' becomes "_D".
func escape(queue string) string {
	if !strings.ContainsAny(queue, "_.") {
		return queue
	}
	var sb strings.Builder
	for i := 0; i < len(queue); i++ {
		switch c := queue[i]; c {
		case '_':
			sb.WriteString("__")
		case '.':
			sb.WriteString("_D")
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

// unescape reverses escape; ok is false for a name escape never makes.
func unescape(esc string) (string, bool) {
	if !strings.Contains(esc, "_") {
		return esc, true
	}
	var sb strings.Builder
	for i := 0; i < len(esc); i++ {
		c := esc[i]
		if c != '_' {
			sb.WriteByte(c)
			continue
		}
		if i+1 == len(esc) {
			return "", false
		}
		i++
		switch esc[i] {
		case '_':
			sb.WriteByte('_')
		case 'D':
			sb.WriteByte('.')
		default:
			return "", false
		}
	}
	return sb.String(), true
}

func (b *Broker) names(queue string) *queueState {
	esc := escape(queue)
	up := strings.ToUpper(b.opts.Prefix)
	return &queueState{
		name:        queue,
		stream:      up + "_Q_" + esc,
		dlq:         up + "_DLQ_" + esc,
		ready:       b.opts.Prefix + ".q." + esc,
		delayed:     b.opts.Prefix + ".d." + esc,
		dead:        b.opts.Prefix + ".dlq." + esc,
		lock:        up + "_LOCK_" + esc,
		lockSubject: b.opts.Prefix + ".lock." + esc,
	}
}

// subjects returns the names of queue's stream and subjects: the declared
// queue's when it is declared (no allocation), else computed.
func (b *Broker) subjects(queue string) *queueState {
	if q, ok := b.declared.Load(queue); ok {
		return q.(*queueState)
	}
	return b.names(queue)
}

// StreamNames returns the names of the stream holding queue's messages and
// of the stream holding its dead letters.
func (b *Broker) StreamNames(queue string) (stream, deadLetters string) {
	q := b.names(queue)
	return q.stream, q.dlq
}

// Subject returns the subject of queue's ready messages: what another
// producer publishes to (a message without berth's header is delivered with
// its Nats-Msg-Id as ID and its headers as headers).
func (b *Broker) Subject(queue string) string { return b.names(queue).ready }

// DeclareQueue creates (or updates to this Broker's options) the queue's
// work-queue stream with its ready and delayed subjects, the two durable pull
// consumers on them, and the dead-letter stream. It is idempotent, and
// writes nothing when they already hold what it would; settings berth does
// not declare (limits an operator set) are kept. It never shortens the ready
// consumer's AckWait nor the streams' dedupe windows (see [Options.AckWait]
// and [Options.Duplicates]), also when several Brokers declare the queue at
// once: they create and lengthen them one at a time, under a lock (a
// message in a memory stream, <PREFIX>_LOCK_<queue>), so that they end with
// the longest each needs.
func (b *Broker) DeclareQueue(ctx context.Context, queue string) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return err
	}
	_, err := b.declare(ctx, queue)
	return err
}

// queue returns the state of queue, declaring it on first use.
func (b *Broker) queue(ctx context.Context, queue string) (*queueState, error) {
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if q, ok := b.declared.Load(queue); ok {
		if qs := q.(*queueState); qs.suspect.Load() {
			return b.recheck(ctx, qs)
		}
		return q.(*queueState), nil
	}
	if b.opts.NoDeclare {
		q := b.names(queue)
		if _, err := b.js.Stream(ctx, q.stream); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, fmt.Errorf("berth/jetstream: queue %s (stream %s): %w: %w", queue, q.stream, sdk.ErrNotFound, err)
			}
			return nil, b.wrapErr(ctx, "look up stream "+q.stream, err)
		}
		actual, _ := b.declared.LoadOrStore(queue, q)
		return actual.(*queueState), nil
	}
	return b.declare(ctx, queue)
}

// declare declares queue (see DeclareQueue). Close waits for it: a
// declaration may hold the queue's declareLock, and must release it before
// Close closes the connection, else every other Broker that declares the
// queue waits declareLockTTL for it to expire. Close cuts it short
// (sdk.ErrClosed).
func (b *Broker) declare(ctx context.Context, queue string) (qs *queueState, err error) {
	if !b.enter() {
		return nil, sdk.ErrClosed
	}
	defer b.wg.Done()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(b.closeCtx, func() { cancel(sdk.ErrClosed) })()
	defer func() {
		if err != nil && errors.Is(context.Cause(ctx), sdk.ErrClosed) {
			err = sdk.ErrClosed
		}
	}()
	q := b.names(queue)
	o := b.opts
	dlq := jetstream.StreamConfig{
		Name:        q.dlq,
		Description: "berth dead letters of queue " + queue,
		Subjects:    []string{q.dead + ".*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     o.Storage,
		Replicas:    o.Replicas,
		Duplicates:  o.Duplicates,
		MaxMsgSize:  -1,
	}
	lock := &declareLock{b: b, stream: q.lock, subject: q.lockSubject, token: strconv.FormatUint(rand.Uint64(), 36)}
	defer lock.release(ctx)
	if err := b.ensureStream(ctx, lock, jetstream.StreamConfig{
		Name:        q.stream,
		Description: "berth queue " + queue,
		Subjects:    []string{q.ready, q.delayed},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     o.Storage,
		Replicas:    o.Replicas,
		Duplicates:  o.Duplicates,
		MaxMsgSize:  -1,
		// A limit an operator sets (MaxMsgs, MaxBytes: kept, see
		// DeclareQueue) refuses a publish past it rather than delete the
		// oldest job to store it: with discard old each Publish returned
		// nil and a stored job was dropped, unknown to anyone.
		Discard: jetstream.DiscardNew,
	}); err != nil {
		return nil, err
	}
	for _, c := range []jetstream.ConsumerConfig{
		{Durable: consumerName, FilterSubject: q.ready, AckWait: o.AckWait},
		{Durable: delayConsumerName, FilterSubject: q.delayed, AckWait: delayAckWait},
	} {
		c.AckPolicy = jetstream.AckExplicitPolicy
		c.DeliverPolicy = jetstream.DeliverAllPolicy
		c.MaxDeliver = -1 // berth counts deliveries itself (see the package doc)
		c.MaxAckPending = -1
		c.MaxWaiting = 4096
		c.Description = "berth " + c.Durable + " " + queue
		if err := b.ensureConsumer(ctx, lock, q.stream, c); err != nil {
			return nil, err
		}
	}
	if err := b.ensureStream(ctx, lock, dlq); err != nil {
		return nil, err
	}
	actual, _ := b.declared.LoadOrStore(queue, q)
	return actual.(*queueState), nil
}

// maxDeclareRounds bounds the read-and-write rounds of ensureStream and
// ensureConsumer: each round that writes is followed by one that reads the
// result, and a write is needed again only when another declaration
// changed the object meanwhile.
const maxDeclareRounds = 16

// ensureStream makes stream want.Name hold want: created when absent,
// else updated to want's settings with the longer of want's Duplicates and
// the stream's (never shortened: another Broker of the queue promises its
// callers that a retried Publish within its own window stores nothing
// twice). Settings berth does not set (limits an operator gave it) are kept.
//
// Other Brokers may declare the queue at the same time, with other
// windows, and JetStream has no conditional update: a write made from a
// read that another's write has since made stale would shorten the
// window, and that Broker, done already, would never know. So the stream
// is created only when absent (a create that finds it made meanwhile fails
// and is not retried as an update: JetStream's create is conditional), and
// updated only under the queue's declareLock, from a read made under it,
// and read again after, until a read finds it holding what is needed.
// berth's other settings are written at most once: two Brokers that
// disagree on them (Replicas, say) end with the last one's, as before,
// rather than overwriting each other for ever.
func (b *Broker) ensureStream(ctx context.Context, lock *declareLock, want jetstream.StreamConfig) error {
	wroteSettings := false
	for range maxDeclareRounds {
		s, err := b.js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if _, err := b.createIfAbsent(ctx, want); err != nil {
				return b.wrapErr(ctx, "declare stream "+want.Name, err)
			}
			continue // read what is there now
		}
		if err != nil {
			return b.wrapErr(ctx, "look up stream "+want.Name, err)
		}
		cur := s.CachedInfo().Config
		same := streamSettingsEqual(cur, want)
		if cur.Duplicates >= want.Duplicates && (same || wroteSettings) {
			return nil
		}
		if !lock.held {
			if err := lock.acquire(ctx); err != nil {
				return err
			}
			continue // read again under the lock
		}
		upd := cur
		if !same {
			upd.Description, upd.Subjects, upd.Retention, upd.Storage = want.Description, want.Subjects, want.Retention, want.Storage
			upd.Replicas, upd.MaxMsgSize, upd.Discard = want.Replicas, want.MaxMsgSize, want.Discard
			wroteSettings = true
		}
		upd.Duplicates = max(cur.Duplicates, want.Duplicates)
		if _, err := b.js.UpdateStream(ctx, upd); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return b.wrapErr(ctx, "declare stream "+want.Name, err)
		}
	}
	return fmt.Errorf("berth/jetstream: declare stream %s: its settings changed under every one of %d updates (other declarations)", want.Name, maxDeclareRounds)
}

// errSubjectsOverlap is JetStream's error code for a stream whose subjects
// overlap another's.
const errSubjectsOverlap jetstream.ErrorCode = 10065

// createIfAbsent creates the stream cfg describes unless one of its name
// exists: created reports that this call created it (or found it with cfg
// already). JetStream's create is conditional, unlike its update.
func (b *Broker) createIfAbsent(ctx context.Context, cfg jetstream.StreamConfig) (created bool, err error) {
	_, err = b.js.CreateStream(ctx, cfg)
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		return false, nil
	case errors.As(err, &apiErr) && apiErr.ErrorCode == errSubjectsOverlap:
		// Two creates of one stream at once: the server may tell the
		// second that its subjects overlap those of the first.
		if _, serr := b.js.Stream(ctx, cfg.Name); serr == nil {
			return false, nil
		}
	}
	return false, err
}

// streamSettingsEqual reports whether cur has the settings berth declares
// in want, the dedupe window aside.
func streamSettingsEqual(cur, want jetstream.StreamConfig) bool {
	return cur.Description == want.Description && slices.Equal(cur.Subjects, want.Subjects) &&
		cur.Retention == want.Retention && cur.Storage == want.Storage && cur.Replicas == want.Replicas &&
		cur.MaxMsgSize == want.MaxMsgSize && cur.Discard == want.Discard
}

// ensureConsumer makes durable consumer want.Durable of stream hold want,
// as ensureStream does a stream, but created under the queue's declareLock
// too: created when absent, else updated when what was read falls short,
// and read again. The ready consumer's AckWait is never shortened (every
// Broker counts its leases by its own, and one still receiving with a
// longer one would settle deliveries the server has handed to another
// consumer); the delay consumer's is berth's own.
func (b *Broker) ensureConsumer(ctx context.Context, lock *declareLock, stream string, want jetstream.ConsumerConfig) error {
	raise := want.Durable == consumerName
	wroteSettings := false
	for range maxDeclareRounds {
		c, err := b.js.Consumer(ctx, stream, want.Durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			// Under the lock too: before 2.10, the server's create updates
			// a consumer another declaration has just created.
			if !lock.held {
				if err := lock.acquire(ctx); err != nil {
					return err
				}
				continue // read again under the lock
			}
			_, err = b.js.CreateConsumer(ctx, stream, want)
			if err == nil || errors.Is(err, jetstream.ErrConsumerExists) {
				continue // read what is there now
			}
			return b.wrapErr(ctx, "declare consumer "+want.Durable+" on "+stream, err)
		}
		if err != nil {
			return b.wrapErr(ctx, "look up consumer "+want.Durable+" on "+stream, err)
		}
		cur := c.CachedInfo().Config
		same := consumerSettingsEqual(cur, want, raise)
		ackWaitOK := !raise || cur.AckWait >= want.AckWait
		if ackWaitOK && (same || wroteSettings) {
			return nil
		}
		if !lock.held {
			if err := lock.acquire(ctx); err != nil {
				return err
			}
			continue // read again under the lock
		}
		upd := cur
		if !same {
			upd.Description, upd.FilterSubject, upd.AckPolicy, upd.DeliverPolicy = want.Description, want.FilterSubject, want.AckPolicy, want.DeliverPolicy
			upd.MaxDeliver, upd.MaxAckPending, upd.MaxWaiting = want.MaxDeliver, want.MaxAckPending, want.MaxWaiting
			upd.HeadersOnly = want.HeadersOnly
			if !raise {
				upd.AckWait = want.AckWait
			}
			wroteSettings = true
		}
		if raise {
			upd.AckWait = max(cur.AckWait, want.AckWait)
		}
		if _, err := b.js.UpdateConsumer(ctx, stream, upd); err != nil && !errors.Is(err, jetstream.ErrConsumerDoesNotExist) {
			return b.wrapErr(ctx, "declare consumer "+want.Durable+" on "+stream, err)
		}
	}
	return fmt.Errorf("berth/jetstream: declare consumer %s on %s: its settings changed under every one of %d updates (other declarations)", want.Durable, stream, maxDeclareRounds)
}

// declareLockHook, when set (by tests), runs with the lock stream's name
// before each attempt to take it (held false) and once a declaration
// holds it (held true).
var declareLockHook func(lockStream string, held bool)

// declareLockTTL is how long a lock whose holder died (see declareLock)
// stays: the lock stream's MaxAge, on the server's clock.
var declareLockTTL = 30 * time.Second // a variable for tests

// declareLockFailFor is how long acquire goes on when every attempt to
// read or take the lock fails (not when another holds it) before it gives
// up with the last failure, also under a ctx without a deadline.
var declareLockFailFor = 30 * time.Second // a variable for tests

// declareLock serialises the writes that declarations of one queue make:
// JetStream's updates are unconditional, and so is a consumer's creation on
// servers before 2.10 (it updates one that exists), so a write made from a
// read that another's write has since made stale would shorten an AckWait
// or a window, and the Broker that needed it, done already, would never
// know. The common declaration, which finds everything as it needs it,
// does not take it.
//
// The lock is a message: a memory stream, <PREFIX>_LOCK_<q> (created when
// absent, and kept), is held while it stores one, whose body is its
// holder's token. A declaration takes it by publishing its token with
// Nats-Expected-Last-Sequence set to the stream's last sequence, read with
// the stream empty: JetStream stores the message only if nothing was
// stored since that read, so of the declarations that read the same empty
// stream only one takes it, and the others' publishes fail (wrong last
// sequence) and they wait. A stream's messages are added only by
// publishes, each of which moves the last sequence, so a publish that
// succeeds found the stream as empty as the read did. The holder releases
// the lock by deleting its message (by its sequence, which no other
// message shares, so never another's lock; only a DeleteQueue that
// deletes the stream meanwhile, sequences starting again, could make it
// so, and release checks the message's token first). One whose holder died expires
// after declareLockTTL (the stream's MaxAge) on the server's clock; the
// stream is then empty, and taking it over is an ordinary take: no delete
// of a stale lock, which JetStream could not make conditional, and no
// client clock. A holder that held it longer than declareLockTTL would
// share it: declarations hold it for a few requests.
type declareLock struct {
	b       *Broker
	stream  string // the lock's
	subject string // its subject: a holder's message is stored on it
	token   string // this holder's
	held    bool
	seq     uint64 // the sequence of this holder's message, when held
	// maybe: a take of the lock failed, and may have been applied.
	maybe bool
	s     jetstream.Stream // the lock stream, once read
}

func (l *declareLock) config() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        l.stream,
		Description: "berth declaration lock: held while it stores a message, its holder's",
		Subjects:    []string{l.subject},
		Storage:     jetstream.MemoryStorage,
		MaxAge:      declareLockTTL,
	}
}

// acquire waits until the lock is this declaration's, or ctx ends. A
// failed attempt (the server refused or did not answer) waits as one that
// found the lock held does; the error acquire returns when ctx ends names
// the last failure.
func (l *declareLock) acquire(ctx context.Context) error {
	var failure error // the last attempt's, nil when it did not fail
	var failingSince time.Time
	for {
		took, err := l.attempt(ctx)
		if took {
			l.held, l.maybe = true, false
			if declareLockHook != nil {
				declareLockHook(l.stream, true)
			}
			return nil
		}
		if err != nil && ctx.Err() != nil {
			if errors.Is(err, ctx.Err()) && failure != nil {
				// This attempt was only cut by ctx: the one before it
				// says why the lock was not taken.
				err = failure
			}
			return l.ended(ctx, err)
		}
		switch {
		case err == nil:
			failure, failingSince = nil, time.Time{}
		case failure == nil:
			failure, failingSince = err, time.Now()
		default:
			failure = err
			if time.Since(failingSince) > declareLockFailFor {
				return fmt.Errorf("berth/jetstream: waiting for declaration lock %s: every attempt failed for %s, the last: %w", l.stream, declareLockFailFor, failure)
			}
		}
		t := time.NewTimer(10*time.Millisecond + rand.N(20*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return l.ended(ctx, failure)
		case <-l.b.closing:
			t.Stop()
			return sdk.ErrClosed
		case <-t.C:
		}
	}
}

// ended returns the error of an acquire whose ctx ended, naming the last
// failure (if any).
func (l *declareLock) ended(ctx context.Context, failure error) error {
	if failure == nil || errors.Is(failure, ctx.Err()) {
		return ctx.Err()
	}
	return fmt.Errorf("berth/jetstream: waiting for declaration lock %s: %w; last attempt failed: %w", l.stream, ctx.Err(), failure)
}

// attempt reads the lock and takes it when it is free: took reports that
// this declaration holds it. A lock held by another is took false, err nil.
func (l *declareLock) attempt(ctx context.Context) (took bool, err error) {
	s, err := l.b.js.Stream(ctx, l.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err := l.b.createIfAbsent(ctx, l.config()); err != nil {
			return false, l.b.wrapErr(ctx, "create declaration lock "+l.stream, err)
		}
		s, err = l.b.js.Stream(ctx, l.stream)
	}
	if err != nil {
		return false, l.b.wrapErr(ctx, "look up declaration lock "+l.stream, err)
	}
	info := s.CachedInfo()
	if info.Config.MaxAge <= 0 {
		// The lock stream of an earlier berth, held while it existed and
		// deleted by its holder: never to expire. Made one of these.
		l.b.opts.Logger.Warn("berth/jetstream: converting a declaration lock of an earlier berth", "stream", l.stream, "description", info.Config.Description)
		if s, err = l.b.js.UpdateStream(ctx, l.config()); err != nil {
			return false, l.b.wrapErr(ctx, "convert declaration lock "+l.stream, err)
		}
		info = s.CachedInfo()
	}
	l.s = s
	if info.State.Msgs > 0 {
		if l.maybe {
			// An earlier take of this declaration's whose answer was
			// lost may be the one stored (a read after it, on the same
			// connection, sees it).
			if m, err := s.GetLastMsgForSubject(ctx, l.subject); err == nil && string(m.Data) == l.token {
				l.seq = m.Sequence
				return true, nil
			}
		}
		return false, nil // held
	}
	if declareLockHook != nil {
		declareLockHook(l.stream, false)
	}
	ack, err := l.b.js.PublishMsg(ctx, &nats.Msg{Subject: l.subject, Data: []byte(l.token)},
		jetstream.WithExpectLastSequence(info.State.LastSeq))
	if err == nil {
		l.seq = ack.Sequence
		return true, nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return false, nil // another took it first
	}
	// The server may have stored it all the same (ctx ended, or the
	// answer was lost, as the publish went through): the next attempt, or
	// release, finds out.
	l.maybe = true
	return false, l.b.wrapErr(ctx, "take declaration lock "+l.stream, err)
}

// release deletes this declaration's message from the lock when it holds
// it, or may hold it (a take whose outcome it does not know); a failure
// leaves the lock to expire after declareLockTTL.
func (l *declareLock) release(ctx context.Context) {
	if (!l.held && !l.maybe) || l.s == nil {
		return
	}
	held, seq := l.held, l.seq
	l.held, l.maybe, l.seq = false, false, 0
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var m *jetstream.RawStreamMsg
	var err error
	if held {
		m, err = l.s.GetMsg(ctx, seq)
	} else {
		m, err = l.s.GetLastMsgForSubject(ctx, l.subject)
	}
	if err != nil || string(m.Data) != l.token {
		return // gone (expired, or the stream deleted), or another's
	}
	_ = l.s.DeleteMsg(ctx, m.Sequence)
}

// consumerSettingsEqual reports whether cur has the settings berth declares
// in want, the AckWait aside when it is raised rather than set. HeadersOnly
// (false) is one of them: a consumer that delivers headers only (set by an
// operator's edit) hands out messages without their bodies, and every copy
// berth stores of one (a dead letter, a release, a move) would lose it.
func consumerSettingsEqual(cur, want jetstream.ConsumerConfig, raise bool) bool {
	return cur.Description == want.Description && cur.FilterSubject == want.FilterSubject &&
		cur.AckPolicy == want.AckPolicy && cur.DeliverPolicy == want.DeliverPolicy &&
		cur.MaxDeliver == want.MaxDeliver && cur.MaxAckPending == want.MaxAckPending &&
		cur.MaxWaiting == want.MaxWaiting && cur.HeadersOnly == want.HeadersOnly &&
		(raise || cur.AckWait == want.AckWait)
}

// AckWaitError reports a queue whose ready consumer has a shorter AckWait
// than the Broker's: the server would redeliver jobs the Broker still holds
// by its clock, and their settlements would not report the lost lease. A
// Broker with [Options.NoDeclare] returns it from Receive (DeclareQueue
// lengthens the consumer's AckWait instead). Give the Broker the consumer's
// AckWait, or lengthen the consumer's.
type AckWaitError struct {
	Queue    string
	Consumer time.Duration // the consumer's AckWait
	Broker   time.Duration // [Options.AckWait]
}

// Error names the queue and both AckWaits.
func (e *AckWaitError) Error() string {
	return fmt.Sprintf("berth/jetstream: queue %s: consumer %q has AckWait %s, shorter than the broker's %s: the server would redeliver jobs the broker still holds",
		e.Queue, consumerName, e.Consumer, e.Broker)
}

// checkAckWait returns an [*AckWaitError] when, with NoDeclare, q's ready
// consumer has a shorter AckWait than the Broker's. It reads the consumer
// until it has once found it fine (again after a pull left unanswered, see
// pull). A ready consumer not found wraps [sdk.ErrNotFound], as a stream not
// found does: a pull on it is never answered, and every Receive would
// return nothing, no error, for ever. A stream not found is left to the
// pull.
func (b *Broker) checkAckWait(ctx context.Context, q *queueState) error {
	if !b.opts.NoDeclare || q.ackWaitOK.Load() {
		return nil
	}
	c, err := b.js.Consumer(ctx, q.stream, consumerName)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("berth/jetstream: queue %s: no consumer %q on stream %s (NoDeclare: declare the queue): %w: %w",
			q.name, consumerName, q.stream, sdk.ErrNotFound, err)
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return b.wrapErr(ctx, "look up consumer "+consumerName+" on "+q.stream, err)
	}
	if w := c.CachedInfo().Config.AckWait; w < b.opts.AckWait {
		return &AckWaitError{Queue: q.name, Consumer: w, Broker: b.opts.AckWait}
	}
	q.ackWaitOK.Store(true)
	return nil
}

// DeleteQueue deletes queue's streams (messages, consumers and dead
// letters). Deleting a queue that does not exist succeeds.
func (b *Broker) DeleteQueue(ctx context.Context, queue string) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return err
	}
	q := b.names(queue)
	b.declared.Delete(queue)
	for _, s := range []string{q.stream, q.dlq, q.lock} {
		if err := b.js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return b.wrapErr(ctx, "delete stream "+s, err)
		}
	}
	return nil
}

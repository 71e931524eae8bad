package jetstream

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthq/berth/sdk"
)

// Stats reads the queue's consumers and dead-letter stream:
//
//   - Ready is the ready consumer's NumPending (stored, never delivered),
//     or, while that consumer does not exist, the ready subject's count;
//   - InFlight is its NumAckPending: deliveries not settled, and also
//     messages waiting out a Retry delay (a nak with a delay) or waiting to
//     be redelivered after a nak or an expired lease, which JetStream counts
//     in the same number;
//   - Delayed counts the delayed subject's messages (publish delays and
//     delayed releases);
//   - DeadLettered is the dead-letter stream's message count;
//   - OldestAge is the age of the oldest never-delivered message.
//
// A queue whose stream does not exist is an error wrapping [sdk.ErrNotFound]
// (and JetStream's own error).
func (b *Broker) Stats(ctx context.Context, queue string) (sdk.QueueStats, error) {
	st := sdk.QueueStats{Queue: queue}
	if b.closed.Load() {
		return st, sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return st, err
	}
	q := b.names(queue)
	ready, err := b.js.Consumer(ctx, q.stream, consumerName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// The same on every broker: an unknown queue is not an empty one.
		return st, fmt.Errorf("jetstream: stats of queue %q: %w: %w", queue, sdk.ErrNotFound, err)
	}
	var from uint64 = 1 // the first stream sequence a never-delivered message may have
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		// Not declared yet, or deleted by an operator: every message on
		// the ready subject waits for the consumer a declaration creates
		// (it delivers them all), and the delayed subject and the
		// dead-letter stream are counted as ever. Returning zeros here
		// hid a stored backlog and every dead letter.
		s, err := b.js.Stream(ctx, q.stream)
		if err != nil {
			return st, b.wrapErr(ctx, "stats", err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(q.ready))
		if err != nil {
			return st, b.wrapErr(ctx, "stats", err)
		}
		st.Ready = int64(info.State.Subjects[q.ready])
	case err != nil:
		return st, b.wrapErr(ctx, "stats", err)
	default:
		ci := ready.CachedInfo()
		st.Ready, st.InFlight = int64(ci.NumPending), int64(ci.NumAckPending)
		from = ci.Delivered.Stream + 1
	}
	if delayed, err := b.js.Consumer(ctx, q.stream, delayConsumerName); err == nil {
		di := delayed.CachedInfo()
		st.Delayed = int64(di.NumPending) + int64(di.NumAckPending)
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return st, b.wrapErr(ctx, "stats", err)
	}
	if dlq, err := b.js.Stream(ctx, q.dlq); err == nil {
		st.DeadLettered = int64(dlq.CachedInfo().State.Msgs)
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return st, b.wrapErr(ctx, "stats", err)
	}
	if st.Ready > 0 {
		s, err := b.js.Stream(ctx, q.stream)
		if err != nil {
			return st, b.wrapErr(ctx, "stats", err)
		}
		raw, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(q.ready))
		if err == nil {
			st.OldestAge = max(time.Since(raw.Time), 0)
		} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return st, b.wrapErr(ctx, "stats", err)
		}
	}
	return st, nil
}

// NotFoundError reports a dead letter that is not there. It wraps
// [sdk.ErrNotFound].
type NotFoundError struct{ Queue, ID string }

func (e *NotFoundError) Error() string {
	return "berth/jetstream: no dead letter " + strconv.Quote(e.ID) + " in queue " + e.Queue
}

// Unwrap returns [sdk.ErrNotFound].
func (e *NotFoundError) Unwrap() error { return sdk.ErrNotFound }

// deadStream returns queue's dead-letter stream, or nil when it does not exist.
func (b *Broker) deadStream(ctx context.Context, queue string) (*queueState, jetstream.Stream, error) {
	if b.closed.Load() {
		return nil, nil, sdk.ErrClosed
	}
	if err := sdk.ValidateQueueName(queue); err != nil {
		return nil, nil, err
	}
	q := b.names(queue)
	s, err := b.js.Stream(ctx, q.dlq)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return q, nil, nil
	}
	if err != nil {
		return nil, nil, b.wrapErr(ctx, "dead letters", err)
	}
	return q, s, nil
}

// deadLetter is one stored dead letter.
type deadLetter struct {
	seq    uint64
	stored time.Time // when the dead-letter stream stored it
	msg    *sdk.Message
	extra  nats.Header // foreign NATS headers, kept by a redriven copy
}

// letterOf decodes raw, a message of the dead-letter stream named stream.
// One that berth cannot read as a message (an undecodable Berth-Message
// header, or one without a message ID, published onto a dead-letter subject
// by another producer or by hand), or that is not on its ID's subject, where
// berth stores a dead letter and looks it up, is listed as it is rather than breaking
// the listing of the others: as a foreign message with ID
// "<stream>:<seq>:<stored>" (see seqID), its NATS headers as headers and its data as body, and a
// [sdk.HeaderDeadLetterReason] telling why, so that an operator sees it
// and can get, delete, redrive or purge it like any other (the SQS broker
// lists an undecodable dead letter as a foreign message too).
func letterOf(raw *jetstream.RawStreamMsg, stream string) deadLetter {
	dec, err := decode(raw.Header, raw.Data, stream, raw.Sequence, raw.Time)
	if err == nil && dec.msg.ID == "" {
		err = fmt.Errorf("%s header without a message ID", headerEnvelope)
	}
	if err == nil && raw.Subject[strings.LastIndexByte(raw.Subject, '.')+1:] != idToken(dec.msg.ID) {
		// Berth stores a dead letter on its ID's subject, where lookup
		// looks for it: listed by its own ID, this one could not be got,
		// deleted or redriven by it.
		err = fmt.Errorf("stored on subject %q, not on that of its ID %q", raw.Subject, dec.msg.ID)
	}
	if err != nil {
		dec = asForeign(raw.Header, raw.Data, seqID(stream, raw.Sequence, raw.Time))
		dec.msg.SetHeader(sdk.HeaderDeadLetterReason, sdk.SanitizeReason("not a berth dead letter: "+err.Error()))
	}
	return deadLetter{seq: raw.Sequence, stored: raw.Time, msg: dec.msg, extra: dec.extra}
}

// lookup returns the dead letters of q (in stream s) listed with id, oldest
// first: those on id's subject and, when id has the "<stream>:<seq>:<stored>" form,
// the letter at seq if it is listed with id (see letterOf: such a letter is
// on a subject of no id). Both can hold: any UTF-8 string is a message ID,
// so a berth message may carry a foreign letter's "<stream>:<seq>:<stored>" (a
// foreign letter redriven and dead-lettered again does, while the original
// stays if the redrive failed half way). An action by id then takes every
// letter listed with it, as it takes every dead letter of a message
// dead-lettered twice; before, the berth letter hid the foreign one from
// every action by id.
func (b *Broker) lookup(ctx context.Context, q *queueState, s jetstream.Stream, id string) ([]deadLetter, error) {
	dls, err := b.scan(ctx, s, q.dead+"."+idToken(id), 0)
	if err != nil {
		return nil, err
	}
	var out []deadLetter
	for _, dl := range dls {
		if dl.msg.ID == id {
			out = append(out, dl)
		}
	}
	seq, ok := seqOf(q, id)
	if !ok || slices.ContainsFunc(out, func(dl deadLetter) bool { return dl.seq == seq }) {
		return out, nil
	}
	raw, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, b.wrapErr(ctx, "read dead letters", err)
	}
	if dl := letterOf(raw, q.dlq); dl.msg.ID == id {
		i, _ := slices.BinarySearchFunc(out, seq, func(dl deadLetter, seq uint64) int { return cmp.Compare(dl.seq, seq) })
		out = slices.Insert(out, i, dl)
	}
	return out, nil
}

// seqOf returns the sequence a "<stream>:<seq>:<stored>" id (see seqID)
// names in q's dead-letter stream; ok is false for an id of another form.
// The letter at seq is the one named only when it is listed with id: one
// stored at that sequence by a recreated stream is listed with another
// store time.
func seqOf(q *queueState, id string) (seq uint64, ok bool) {
	rest, ok := strings.CutPrefix(id, q.dlq+":")
	if !ok {
		return 0, false
	}
	rest, stamp, ok := strings.Cut(rest, ":")
	if !ok {
		return 0, false
	}
	if _, err := strconv.ParseInt(stamp, 10, 64); err != nil {
		return 0, false
	}
	seq, err := strconv.ParseUint(rest, 10, 64)
	return seq, err == nil && seq > 0
}

// scan returns up to limit dead letters on subject, oldest first (limit
// <= 0: all).
func (b *Broker) scan(ctx context.Context, s jetstream.Stream, subject string, limit int) ([]deadLetter, error) {
	return b.scanFrom(ctx, s, subject, 1, limit)
}

// scanFrom is scan from stream sequence seq on.
func (b *Broker) scanFrom(ctx context.Context, s jetstream.Stream, subject string, seq uint64, limit int) ([]deadLetter, error) {
	return b.scanRange(ctx, s, subject, seq, math.MaxUint64, limit)
}

// scanRange is scanFrom of the stream sequences up to upTo.
func (b *Broker) scanRange(ctx context.Context, s jetstream.Stream, subject string, seq, upTo uint64, limit int) ([]deadLetter, error) {
	var out []deadLetter
	for (limit <= 0 || len(out) < limit) && seq <= upTo {
		raw, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, b.wrapErr(ctx, "read dead letters", err)
		}
		if raw.Sequence > upTo {
			break
		}
		out = append(out, letterOf(raw, s.CachedInfo().Config.Name))
		seq = raw.Sequence + 1
	}
	return out, nil
}

// ListDeadLetters returns up to limit of queue's dead letters, oldest
// first, with their reason headers. A limit <= 0 means [sdk.DefaultListLimit].
func (b *Broker) ListDeadLetters(ctx context.Context, queue string, limit int) ([]*sdk.Message, error) {
	q, s, err := b.deadStream(ctx, queue)
	if err != nil || s == nil {
		return nil, err
	}
	if limit <= 0 {
		limit = sdk.DefaultListLimit
	}
	dls, err := b.scan(ctx, s, q.dead+".*", limit)
	if err != nil {
		return nil, err
	}
	out := make([]*sdk.Message, len(dls))
	for i, dl := range dls {
		out[i] = dl.msg
	}
	return out, nil
}

// GetDeadLetter returns queue's dead letter with id (the latest, should the
// same message have been dead-lettered twice), or a [*NotFoundError].
func (b *Broker) GetDeadLetter(ctx context.Context, queue, id string) (*sdk.Message, error) {
	q, s, err := b.deadStream(ctx, queue)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, &NotFoundError{Queue: queue, ID: id}
	}
	raw, err := s.GetLastMsgForSubject(ctx, q.dead+"."+idToken(id))
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, b.wrapErr(ctx, "get dead letter", err)
	}
	if _, seqForm := seqOf(q, id); err == nil && !seqForm {
		if dl := letterOf(raw, q.dlq); dl.msg.ID == id {
			return dl.msg, nil
		}
		// Two ids hashed to one token, or not berth's: looked up below.
	}
	// An id of the "<stream>:<seq>:<stored>" form may also name a foreign letter
	// (see lookup): looked up below, the latest of them returned.
	dls, err := b.lookup(ctx, q, s, id)
	if err != nil {
		return nil, err
	}
	if len(dls) == 0 {
		return nil, &NotFoundError{Queue: queue, ID: id}
	}
	return dls[len(dls)-1].msg, nil
}

// CountDeadLetters returns how many dead letters of queue hold the message
// ID id: the letters a redrive or delete of id moves (each of them, see
// lookup), 0 when none does. The CLI and dashboard confirm a change of
// chosen IDs with that count.
func (b *Broker) CountDeadLetters(ctx context.Context, queue, id string) (int, error) {
	q, s, err := b.deadStream(ctx, queue)
	if err != nil || s == nil {
		return 0, err
	}
	dls, err := b.lookup(ctx, q, s, id)
	return len(dls), err
}

// RedriveDeadLetters stores the dead letters with the given ids (all when
// none is given) again on queue, ready now, with attempts reset and
// [sdk.HeaderRedriveCount] incremented, and deletes them from the
// dead-letter stream. The target is always queue, whose dead-letter stream
// they are in; a berth-dlq-queue header is never followed. An unknown id is
// a [*NotFoundError], and then nothing is redriven. Each copy's Nats-Msg-Id
// is derived from its dead-letter sequence, so a redrive repeated after a
// failure stores nothing twice within the dedupe window.
//
// A dead letter is either redriven or deleted by a purge (or a delete, or
// another redrive) that runs meanwhile, never both, and only the call that
// took it counts it. Deleting the letter decides, so the redrive first
// stores a held copy (on the delayed subject, due in [redriveHold]), then
// deletes the letter, then stores the ready copy and deletes the held one.
// A letter another call took meanwhile has its held copy deleted; a
// redrive that stops half way (a failure, a crash) leaves the held copy,
// which a mover makes ready when due: a letter is never lost, but on such
// a failure it may run twice or stay in the dead-letter stream as well (a
// failed delete of the letter, or of the held copy of a letter another
// call took), and a redrive slower than the hold (a minute) from storing
// the held copy to deleting it runs the job twice. While a redrive runs,
// its held copies count as Delayed in Stats. With no ids it redrives the
// letters stored when it starts, a page at a time (bounded memory, whatever
// the dead-letter stream holds).
func (b *Broker) RedriveDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	q, s, err := b.deadStream(ctx, queue)
	if err != nil {
		return 0, err
	}
	if s == nil {
		if len(ids) > 0 {
			return 0, &NotFoundError{Queue: queue, ID: ids[0]}
		}
		return 0, nil
	}
	if len(ids) == 0 {
		return b.redriveAll(ctx, queue, q, s)
	}
	picked, err := b.pick(ctx, queue, q, s, ids)
	if err != nil {
		return 0, err
	}
	target, ts, err := b.redriveTarget(ctx, queue)
	if err != nil {
		return 0, err
	}
	return b.redriveLetters(ctx, queue, q, s, target, ts, picked, rand.Uint64())
}

// pick returns the dead letters of queue (q, s) with ids, each id once,
// or a [*NotFoundError] for the first id it has none of.
func (b *Broker) pick(ctx context.Context, queue string, q *queueState, s jetstream.Stream, ids []string) ([]deadLetter, error) {
	var picked []deadLetter
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		dls, err := b.lookup(ctx, q, s, id)
		if err != nil {
			return nil, err
		}
		if len(dls) == 0 {
			return nil, &NotFoundError{Queue: queue, ID: id}
		}
		picked = append(picked, dls...)
	}
	return picked, nil
}

// redriveLetters redrives dls to queue (target, ts) with redriveOne, in
// order, and returns how many this call took; it stops at the first error.
func (b *Broker) redriveLetters(ctx context.Context, queue string, q *queueState, s jetstream.Stream, target *queueState, ts jetstream.Stream, dls []deadLetter, call uint64) (int, error) {
	n := 0
	for _, dl := range dls {
		sdk.PrepareRedrive(dl.msg, queue) // the target is queue, whatever the header says
		took, err := b.redriveOne(ctx, q, s, target, ts, dl, call)
		if took {
			n++
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// redrivePage bounds the dead letters RedriveDeadLetters with no ids holds
// at once, bodies included: a dead-letter stream may hold more than the
// process's memory.
var redrivePage = 256

// redriveAll redrives every dead letter of queue stored when it starts
// (letters stored later, a redriven job failing again, are left for the
// next call), a page of redrivePage letters at a time, oldest first.
func (b *Broker) redriveAll(ctx context.Context, queue string, q *queueState, s jetstream.Stream) (int, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, b.wrapErr(ctx, "redrive dead letters", err)
	}
	upTo := info.State.LastSeq
	var (
		target *queueState
		ts     jetstream.Stream
		n      int
		seq    uint64 = 1
		call          = rand.Uint64()
	)
	for seq <= upTo {
		page, err := b.scanRange(ctx, s, q.dead+".*", seq, upTo, redrivePage)
		if err != nil {
			return n, err
		}
		if len(page) == 0 {
			break
		}
		if target == nil {
			if target, ts, err = b.redriveTarget(ctx, queue); err != nil {
				return n, err
			}
		}
		k, err := b.redriveLetters(ctx, queue, q, s, target, ts, page, call)
		n += k
		if err != nil {
			return n, err
		}
		seq = page[len(page)-1].seq + 1
	}
	return n, nil
}

// redriveTarget returns queue's state and stream, for a redrive to it.
func (b *Broker) redriveTarget(ctx context.Context, queue string) (*queueState, jetstream.Stream, error) {
	target, err := b.queue(ctx, queue)
	if err != nil {
		return nil, nil, err
	}
	ts, err := b.js.Stream(ctx, target.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// The queue's stream was deleted by another process after this
		// Broker declared it (its declared entry is stale): declared
		// again, as Publish does, else every redrive failed until the
		// Broker was replaced. With NoDeclare: ErrNotFound.
		if target, err = b.redeclare(ctx, target); err != nil {
			return nil, nil, err
		}
		ts, err = b.js.Stream(ctx, target.stream)
	}
	if err != nil {
		return nil, nil, b.wrapErr(ctx, "redrive dead letters", err)
	}
	return target, ts, nil
}

// redriveHold is how long the held copy of a dead letter being redriven
// waits on the delayed subject: far longer than a redrive takes from
// storing it to deleting it, so that no mover makes it ready meanwhile.
const redriveHold = time.Minute

// redriveOne redrives one dead letter (see RedriveDeadLetters); took
// reports whether this call took it from the dead-letter stream.
//
// call numbers the redrive call: the held copy is this call's own (see
// idRedriveHold).
func (b *Broker) redriveOne(ctx context.Context, q *queueState, s jetstream.Stream, target *queueState, ts jetstream.Stream, dl deadLetter, call uint64) (took bool, err error) {
	held, err := encode(dl.msg, dl.extra, target.delayed, 1, time.Now().Add(redriveHold))
	if err != nil {
		return false, err
	}
	pa, err := b.js.PublishMsg(ctx, held, jetstream.WithMsgID(internalID(idRedriveHold, q.dlq, dl.seq, call)))
	if err != nil {
		return false, b.wrapErr(ctx, "redrive dead letter", err)
	}
	if redriveHook != nil {
		redriveHook(dl.seq)
	}
	took, err = b.take(ctx, s, dl.seq)
	if err != nil {
		// Whether the letter was deleted is not known: the held copy
		// stays, so that it is not lost.
		return false, b.wrapErr(ctx, "delete redriven dead letter", err)
	}
	if !took {
		// Purged, deleted or redriven by another call since it was read:
		// not this redrive's.
		if _, err := b.take(ctx, ts, pa.Sequence); err != nil {
			return false, b.wrapErr(ctx, "delete the held copy of a dead letter taken meanwhile", err)
		}
		return false, nil
	}
	w, err := encode(dl.msg, dl.extra, target.ready, 1, time.Time{})
	if err != nil {
		return true, err // the held copy becomes ready when due
	}
	// With the store time: the queue stream outlives a dead-letter stream
	// deleted and created again, and within its Duplicates window would
	// drop the copy of a new letter at an old letter's sequence.
	if err := b.publishOne(ctx, target.stream, w, internalID(idRedrive, q.dlq, dl.seq, uint64(dl.stored.UnixNano()))); err != nil {
		return true, err // likewise
	}
	if _, err := b.take(ctx, ts, pa.Sequence); err != nil {
		return true, b.wrapErr(ctx, "delete the held copy of a redriven dead letter", err)
	}
	return true, nil
}

// take deletes message seq from s and reports whether this call deleted
// it: false, with no error, when it is not there (deleted or purged by
// another call). The server answers the delete of a missing message with a
// failed delete ("no message found"), which a read of the message confirms.
func (b *Broker) take(ctx context.Context, s jetstream.Stream, seq uint64) (bool, error) {
	err := s.DeleteMsg(ctx, seq)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		if _, gerr := s.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return false, nil
		}
	}
	return false, err
}

// Hooks the tests set: redriveHook runs once a redrive has stored a dead
// letter's held copy and before it takes the letter; purgeHook runs once a
// purge has read the dead-letter stream's state and before it purges.
var (
	redriveHook func(seq uint64)
	purgeHook   func()
)

// PurgeDeadLetters deletes queue's dead letters and returns how many (as
// the server counts them: not those another call took meanwhile). Dead
// letters stored while it runs are kept.
func (b *Broker) PurgeDeadLetters(ctx context.Context, queue string) (int, error) {
	_, s, err := b.deadStream(ctx, queue)
	if err != nil || s == nil {
		return 0, err
	}
	st := s.CachedInfo().State
	if st.Msgs == 0 {
		return 0, nil
	}
	if purgeHook != nil {
		purgeHook()
	}
	// nats.go's Stream.Purge drops the server's count: the request is
	// made here, on the default API prefix, as New uses no JetStream
	// domain or prefix (one set there must be set here too).
	req, err := json.Marshal(jetstream.StreamPurgeRequest{Sequence: st.LastSeq + 1})
	if err != nil {
		return 0, err
	}
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		rctx, cancel = context.WithTimeout(ctx, settleTimeout)
	}
	defer cancel()
	msg, err := b.nc.RequestWithContext(rctx, jetstream.DefaultAPIPrefix+"STREAM.PURGE."+s.CachedInfo().Config.Name, req)
	if err != nil {
		return 0, b.wrapErr(ctx, "purge dead letters", err)
	}
	var resp struct {
		Error  *jetstream.APIError `json:"error"`
		Purged uint64              `json:"purged"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("berth/jetstream: purge dead letters: %w", err)
	}
	if resp.Error != nil {
		return 0, b.wrapErr(ctx, "purge dead letters", resp.Error)
	}
	return int(resp.Purged), nil
}

// DeadLetterPage returns up to limit (default [sdk.DefaultListLimit]) of
// queue's dead letters after cursor, oldest first, and the cursor of the
// next page ("" after the last page). The cursor is a dead-letter stream
// sequence, so it stays valid while the dead letters it passed are
// redriven or deleted.
func (b *Broker) DeadLetterPage(ctx context.Context, queue, cursor string, limit int) ([]*sdk.Message, string, error) {
	return b.deadLetterPage(ctx, queue, cursor, math.MaxUint64, limit)
}

// DeadLetterMark returns a mark of the dead letters queue holds now (the
// last sequence of its dead-letter stream), for [Broker.DeadLetterPageTo]:
// "" when it holds none.
func (b *Broker) DeadLetterMark(ctx context.Context, queue string) (string, error) {
	_, s, err := b.deadStream(ctx, queue)
	if err != nil || s == nil {
		return "", err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return "", b.wrapErr(ctx, "dead letters", err)
	}
	if info.State.Msgs == 0 {
		return "", nil
	}
	return strconv.FormatUint(info.State.LastSeq, 10), nil
}

// DeadLetterPageTo is [Broker.DeadLetterPage] restricted to the dead
// letters at or before mark (from [Broker.DeadLetterMark]): one
// dead-lettered after the mark was taken, even again after a redrive, has
// a later sequence and is not returned. The cursor of the next page is ""
// after the last page that reaches the mark; the mark "" returns none.
func (b *Broker) DeadLetterPageTo(ctx context.Context, queue, cursor, mark string, limit int) ([]*sdk.Message, string, error) {
	if mark == "" {
		_, _, err := b.deadStream(ctx, queue)
		return nil, "", err
	}
	upTo, err := strconv.ParseUint(mark, 10, 64)
	if err != nil {
		return nil, "", fmt.Errorf("berth/jetstream: invalid dead-letter mark %q", mark)
	}
	return b.deadLetterPage(ctx, queue, cursor, upTo, limit)
}

// deadLetterPage is DeadLetterPage of the stream sequences up to upTo.
func (b *Broker) deadLetterPage(ctx context.Context, queue, cursor string, upTo uint64, limit int) ([]*sdk.Message, string, error) {
	q, s, err := b.deadStream(ctx, queue)
	if err != nil || s == nil {
		return nil, "", err
	}
	var after uint64
	if cursor != "" {
		if after, err = strconv.ParseUint(cursor, 10, 64); err != nil {
			return nil, "", fmt.Errorf("berth/jetstream: invalid dead-letter page cursor %q", cursor)
		}
	}
	if limit <= 0 {
		limit = sdk.DefaultListLimit
	}
	// One more than asked tells whether another page follows.
	dls, err := b.scanRange(ctx, s, q.dead+".*", after+1, upTo, limit+1)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(dls) > limit {
		dls = dls[:limit]
		next = strconv.FormatUint(dls[limit-1].seq, 10)
	}
	out := make([]*sdk.Message, len(dls))
	for i, dl := range dls {
		out[i] = dl.msg
	}
	return out, next, nil
}

// DeleteDeadLetters deletes queue's dead letters with the given ids and
// returns how many (not those another call took meanwhile). An unknown id
// is a [*NotFoundError], and then nothing is deleted. With no ids it deletes
// nothing.
func (b *Broker) DeleteDeadLetters(ctx context.Context, queue string, ids ...string) (int, error) {
	q, s, err := b.deadStream(ctx, queue)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	if s == nil {
		return 0, &NotFoundError{Queue: queue, ID: ids[0]}
	}
	picked, err := b.pick(ctx, queue, q, s, ids)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, dl := range picked {
		took, err := b.take(ctx, s, dl.seq)
		if err != nil {
			return n, b.wrapErr(ctx, "delete dead letter", err)
		}
		if took { // else purged, deleted or redriven by another call meanwhile
			n++
		}
	}
	return n, nil
}

// Queues returns the berth queues on the server (the streams named with
// this Broker's Prefix), sorted.
func (b *Broker) Queues(ctx context.Context) ([]string, error) {
	if b.closed.Load() {
		return nil, sdk.ErrClosed
	}
	prefix := strings.ToUpper(b.opts.Prefix) + "_Q_"
	names := b.js.StreamNames(ctx)
	var out []string
	for name := range names.Name() {
		if esc, ok := strings.CutPrefix(name, prefix); ok {
			if q, ok := unescape(esc); ok {
				out = append(out, q)
			}
		}
	}
	if err := names.Err(); err != nil {
		return nil, b.wrapErr(ctx, "list streams", err)
	}
	slices.Sort(out)
	return out, nil
}

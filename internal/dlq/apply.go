package dlq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/berthq/berth/sdk"
)

// Action is what [Apply] does to the chosen dead letters.
type Action int

const (
	// Redrive puts them back on their queue (sdk.DeadLetters.RedriveDeadLetters).
	Redrive Action = iota
	// Delete removes them for good ([Deleter] or [Sweeper], or
	// PurgeDeadLetters when the filter chooses every dead letter and the
	// broker cannot delete by id or sweeps).
	Delete
)

func (a Action) String() string {
	if a == Delete {
		return "purge"
	}
	return "redrive"
}

// PageTimeout bounds one broker call of [Apply], which its ctx does not cut.
const PageTimeout = 2 * time.Minute

// ErrUnsupported is wrapped by the error of an operation the broker lacks.
var ErrUnsupported = errors.New("not supported by this broker")

// Failure is a chosen ID whose dead letters were not moved, and why. It
// stands for every chosen letter holding the ID that was not moved for
// that reason (Result.Missed counts each).
type Failure struct {
	ID  string
	Err error
}

// Result is the account of an [Apply].
type Result struct {
	Summary
	Done int // dead letters redriven or deleted
	// Failed names the chosen dead letters not done, an ID once for its
	// letters, with why: at most MaxFailures are kept, and a broker call
	// that moved some of its letters does not say which of the others it
	// did not (see Unnamed).
	Failed []Failure
	Missed int // chosen dead letters not done, each counted
	named  int // of Missed, the letters Failed names
}

// Unnamed is how many of the Missed letters no Failure of Failed names
// (past MaxFailures, or left by a broker call that does not say which):
// the "and N more" of a report that lists Failed.
func (r Result) Unnamed() int { return r.Missed - r.named }

// fail counts letters chosen dead letters holding id as missed for err,
// named by one Failure while Failed has room.
func (r *Result) fail(id string, letters int, err error) {
	r.Missed += letters
	if len(r.Failed) < MaxFailures {
		r.Failed = append(r.Failed, Failure{ID: id, Err: err})
		r.named += letters
	}
}

// MaxFailures bounds Result.Failed, so that memory stays bounded.
const MaxFailures = 100

// Apply redrives or deletes the dead letters of queue that f chooses, page by
// page: each page's chosen IDs go to the broker in one call, then progress
// is called with the running count. A chosen dead letter that is gone when
// its page is applied (another operator, a concurrent purge) is a Failure,
// not an error: the others of its page are applied one by one. Apply stops
// at the first other error, or when ctx is done (between pages: the page in
// hand is finished, not cut), and returns the result so far with that error:
// everything counted in Done was done, nothing else was. (When the broker
// call itself fails, what it did of its page is the count it returns with
// the error, counted in Done, and the letters a *sdk.PublishError names as
// refused in Missed: PostgreSQL and memory do all of a page or none of it,
// SQS, JetStream and RabbitMQ move letter by letter and say how many.)
//
// Where Apply calls the broker's own redrive or purge of every dead letter
// (no filter and no Limit, on a broker that cannot page them), progress is
// called after each page when the broker is a [Progresser] (SQS), and only
// at the end otherwise.
//
// A redrive walks the dead letters there are when it begins: on a [Bounded]
// broker it stops where the dead-letter queue ended then, so a letter
// dead-lettered (or dead-lettered again by a consumer) while it runs is
// left for the next one, and its memory stays bounded. On a [Pager] that is
// not Bounded it keeps the ID of each letter it redrove (memory grows with
// the count), so as not to redrive one a consumer dead-letters again.
//
// Brokers move dead letters by ID, every letter holding an ID they are
// given. So when f has no IDs (a filter, or Limit, chooses), a chosen letter
// whose ID dead letters f did not choose (or past Limit) hold too is not
// moved, on a broker that counts the letters of an ID ([IDCounter]; one
// [IDsCounter] call a page), or on one with neither Pager nor Sweeper (SQS:
// the letters of its one scan, read before any is moved, are counted by
// ID): a Failure wrapping [ErrSharedID], counted in
// Missed and in Summary.Withheld, as [Preview] counts it. Letters sharing an
// ID that are all chosen are moved, those of different pages once the last
// is met. An Apply that an error stops names the IDs it had held back by
// then the same way (their text says it stopped: it might have chosen
// their other letters further on), apart from the letters it never reached.
//
// Missed counts letters, as Matched does: a Failure names an ID once for
// all of its chosen letters that were not moved ([Result.Unnamed] is how
// many no Failure names).
func Apply(ctx context.Context, dl sdk.DeadLetters, queue string, f Filter, act Action, o Options, progress func(done int)) (Result, error) {
	var r Result
	do := func(ctx context.Context, ids []string) (int, error) {
		// A page is not cut by ctx: once started it finishes and is
		// counted, so an interrupted Apply reports exactly what it did.
		// ctx is checked between pages.
		// PageTimeout still bounds a broker that hangs.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), PageTimeout)
		defer cancel()
		if act == Redrive {
			return dl.RedriveDeadLetters(ctx, queue, ids...)
		}
		d, ok := dl.(Deleter)
		if !ok {
			return 0, fmt.Errorf("deleting chosen dead letters: %w (purge all of them, with no filter)", ErrUnsupported)
		}
		return d.DeleteDeadLetters(ctx, queue, ids...)
	}
	_, paged := dl.(Pager)
	sw, sweeps := dl.(Sweeper)
	purgeAll := act == Delete && f.IsZero() && o.Limit <= 0
	if sweeps && !paged && !purgeAll {
		return sweepApply(ctx, sw, queue, f, act, o, progress)
	}
	if len(f.IDs) > 0 {
		return applyIDs(ctx, dl, queue, f, o, do, progress)
	}
	if purgeAll {
		if _, deletes := dl.(Deleter); !paged || !deletes { // the broker's own purge of all beats a capped scan or a sweep
			if pr, ok := dl.(Progresser); ok {
				n, err := pr.PurgeDeadLettersProgress(ctx, queue, progress)
				return r.all(n, err, progress)
			}
			n, err := dl.PurgeDeadLetters(ctx, queue)
			return r.all(n, err, progress)
		}
	}
	if act == Redrive && f.IsZero() && o.Limit <= 0 {
		if _, ok := dl.(Pager); !ok { // the broker's own redrive of all beats a capped scan
			if pr, ok := dl.(Progresser); ok {
				n, err := pr.RedriveDeadLettersProgress(ctx, queue, progress)
				return r.all(n, err, progress)
			}
			n, err := dl.RedriveDeadLetters(ctx, queue)
			return r.all(n, err, progress)
		}
	}
	var err error
	stopped := "" // why a broker call's own scan stopped
	// A letter a consumer dead-letters again while this Apply redrives
	// comes back at the walk's end, and must not be redriven again (with a
	// consumer that keeps failing it the walk would never end). A [Bounded]
	// broker stops the walk where the dead-letter queue ended when it
	// began, before any letter came back; on another broker Apply keeps
	// the IDs of the letters it redrove (redriven), one per letter.
	// The letters skipped are not matched again: Matched and Limit count
	// each letter once.
	var redriven map[string]bool
	mode := walkMode{toMark: act == Redrive, light: true} // do reads only IDs
	if _, bounded := dl.(Bounded); act == Redrive && !bounded {
		redriven = map[string]bool{}
		mode.skip = func(m *sdk.Message) bool { return redriven[m.ID] }
	}
	// A letter whose ID letters the change did not choose hold too is
	// held back (see idGuard): the broker would move those with it.
	guard := newIDGuard(dl, queue, f, o)
	if guard != nil && guard.totals != nil {
		mode.count = guard.scanned // counted before any page is moved
	}
	r.Summary, err = walk(ctx, dl, queue, f, o, mode, func(page []*sdk.Message) error {
		ids := make([]string, 0, len(page))
		if guard != nil {
			var err error
			if ids, err = guard.page(ctx, page); err != nil {
				return err
			}
			if len(ids) == 0 {
				return nil
			}
		} else {
			for _, m := range page {
				ids = append(ids, m.ID)
			}
		}
		if redriven != nil {
			for _, id := range ids {
				redriven[id] = true
			}
		}
		n, err := do(ctx, ids)
		switch {
		case err == nil:
			r.Done += n
			if n < len(ids) { // the broker moved fewer than asked without an error
				r.Missed += len(ids) - n
			}
		case ScanIncomplete(err):
			// The broker's scan for this page's letters stopped before it
			// found them all: those not done stay, and the walk goes on.
			stopped = err.Error()
			r.Done += n
			r.missPage(tally(ids), n, err)
		case errors.Is(err, sdk.ErrNotFound) && n > 0:
			// The broker moved the letters it found (SQS does) and names
			// the others in err: trying each again would count those it
			// moved as missing.
			r.Done += n
			r.missPage(tally(ids), n, err)
		case errors.Is(err, sdk.ErrNotFound):
			// ID by ID, each once: letters of the page sharing an ID
			// (len(ids) counts each) are all moved by one call, and
			// are all missed when none is found.
			letters := make(map[string]int, len(ids))
			for _, id := range ids {
				letters[id]++
			}
			for _, id := range ids {
				k := letters[id]
				if k == 0 {
					continue // tried already
				}
				letters[id] = 0
				n, err := do(ctx, []string{id})
				switch {
				case err == nil && n > 0: // every letter holding id
					r.Done += n
				case err == nil || errors.Is(err, sdk.ErrNotFound):
					if err == nil {
						err = sdk.ErrNotFound
					}
					r.fail(id, k, err)
				case ScanIncomplete(err):
					// As for a page: the scan for this letter stopped
					// before it found it; it stays, and the walk goes on.
					stopped = err.Error()
					r.Done += n
					r.missPage([]idLetters{{id, k}}, n, err)
				default:
					r.cut([]string{id}, n, err)
					return err
				}
			}
		default:
			r.cut(ids, n, err)
			return err
		}
		if progress != nil {
			progress(r.Done)
		}
		return nil
	})
	if stopped != "" && r.Incomplete == "" {
		r.Complete, r.Incomplete = false, stopped
	}
	if guard != nil {
		// Named even when an error stopped the walk, as held back so far
		// (letters holding the ID may have been chosen further on): apart
		// from the letters the walk never reached.
		for _, h := range guard.held() {
			r.Withheld += h.chosen
			r.fail(h.id, h.chosen, h.err(err != nil))
		}
	}
	return r, err
}

// all accounts for a broker's own redrive or purge of every dead letter,
// which did n: a report that its scan stopped before the end is a result
// (Incomplete), not an error.
func (r Result) all(n int, err error, progress func(int)) (Result, error) {
	r.Done, r.Matched, r.Complete = n, n, err == nil
	if ScanIncomplete(err) {
		r.Incomplete, err = err.Error(), nil
	}
	if progress != nil && err == nil {
		progress(n)
	}
	return r, err
}

// idLetters is a chosen ID of a broker call and how many of the chosen
// letters hold it.
type idLetters struct {
	id      string
	letters int
}

// tally returns ids, one for each chosen letter (as [Apply]'s walk moves
// a page), as each distinct ID with its letters, in order.
func tally(ids []string) []idLetters {
	at := make(map[string]int, len(ids))
	var out []idLetters
	for _, id := range ids {
		i, ok := at[id]
		if !ok {
			i = len(out)
			at[id] = i
			out = append(out, idLetters{id: id})
		}
		out[i].letters++
	}
	return out
}

// missPage counts the letters of a broker call on ids (each ID with the
// chosen letters holding it) that it did not do, all of them less the n
// it did, naming each ID when it did none (a partial call does not say
// which). Letters, not IDs: a change of an ID moves every letter holding
// it, and Matched counts each. A broker may move more letters than were
// counted (the SQS broker redrives every letter holding a requested ID,
// and an ID a walk did not meet counts one; a letter may be dead-lettered
// since), so n may exceed them: none is counted then, never a negative
// number.
func (r *Result) missPage(ids []idLetters, n int, err error) {
	if n > 0 {
		letters := 0
		for _, c := range ids {
			letters += c.letters
		}
		r.Missed += max(letters-n, 0)
		return
	}
	for _, c := range ids {
		r.fail(c.id, c.letters, err)
	}
}

// cut accounts for a broker call on ids that failed with err, which ends
// the Apply, after doing n of them: the brokers that move letter by letter
// (SQS, JetStream, RabbitMQ) return how many they moved with the error, and
// the report must count them, or an interrupted Apply would say it did
// less than it did. The letters a *sdk.PublishError names were refused one
// by one: missed, with their reasons. The others of ids are left as the
// letters the Apply never reached: not done, and the error says why.
//
// The refused letters are counted by the PublishError's entries, one each,
// never by looking each of ids up in it: letters may share an ID (foreign
// messages often have none, so share the empty one), and a letter moved
// (counted in n) whose ID a refused one shares would be counted missed too.
// Its map holds one entry per ID, so letters sharing an ID that were all
// refused count as one: the broker does not say how many there were.
func (r *Result) cut(ids []string, n int, err error) {
	r.Done += n
	var pe *sdk.PublishError
	if !errors.As(err, &pe) {
		return
	}
	miss := func(id string) { r.fail(id, 1, pe.Failed[id]) }
	// In the order of ids, each entry once; then any the broker named by
	// another ID (one it knows the letter by, e.g. SQS's MessageId).
	named := make(map[string]bool, len(pe.Failed))
	for _, id := range ids {
		if _, ok := pe.Failed[id]; ok && !named[id] {
			named[id] = true
			miss(id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(pe.Failed)) {
		if !named[id] {
			miss(id)
		}
	}
}

// applyIDs is Apply for a filter that names its dead letters: each is
// looked up (a missing one is a Failure), checked against the rest of the
// filter, and the chosen ones are moved PageSize at a time. Matched and
// Limit count letters, not IDs: a chosen ID counts every dead letter
// holding it (the broker moves them all; see [IDCounter] and eachID), and
// one whose letters do not all fit in what is left of Limit is not changed
// but named, a Failure wrapping [ErrOverLimit], its letters counted in
// Missed, as are those of a chosen ID the broker did not move.
func applyIDs(ctx context.Context, dl sdk.DeadLetters, queue string, f Filter, o Options, do func(context.Context, []string) (int, error), progress func(int)) (Result, error) {
	o = o.withDefaults()
	var r Result
	matched, shared, more := 0, 0, false
	incomplete := "" // why a broker call's own scan stopped
	// batch holds the chosen IDs to move, each with the letters holding it
	// (counted: Missed counts letters, as Matched does).
	var batch []idLetters
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		ids := make([]string, len(batch))
		for i, c := range batch {
			ids[i] = c.id
		}
		n, err := do(ctx, ids)
		switch {
		case err == nil:
			r.Done += n
		case ScanIncomplete(err):
			r.Done += n
			incomplete = err.Error()
			r.missPage(batch, n, err)
		case errors.Is(err, sdk.ErrNotFound) && n > 0: // as in Apply's walk
			r.Done += n
			r.missPage(batch, n, err)
		case errors.Is(err, sdk.ErrNotFound):
			for _, c := range batch {
				n, err := do(ctx, []string{c.id})
				switch {
				case err == nil && n > 0: // every letter holding id
					r.Done += n
				case err == nil || errors.Is(err, sdk.ErrNotFound):
					r.fail(c.id, c.letters, sdk.ErrNotFound)
				case ScanIncomplete(err): // as for a batch: partial, not fatal
					r.Done += n
					incomplete = err.Error()
					r.missPage([]idLetters{c}, n, err)
				default:
					r.cut([]string{c.id}, n, err)
					return err
				}
			}
		default:
			r.cut(ids, n, err)
			return err
		}
		batch = batch[:0]
		if progress != nil {
			progress(r.Done)
		}
		return nil
	}
	s, err := eachID(ctx, dl, queue, f, o, 0, func(c idCount) error {
		switch {
		case errors.Is(c.err, sdk.ErrNotFound):
			r.fail(c.id, 1, c.err)
			return nil
		case c.err != nil: // a ScanIncomplete (eachID set Incomplete)
			r.fail(c.id, 1, c.err)
			return nil
		case !c.chosen:
			return nil
		case o.Limit > 0 && matched == o.Limit:
			// Past Limit it only looks, as sweepApply does: to say that
			// more would match, and to name the IDs that are not dead
			// letters (a change confirmed for the count found stops at
			// it, and must still say which named IDs it did not find).
			more = true
			return nil
		case o.Limit > 0 && matched+c.n > o.Limit:
			// A change of the ID moves every letter holding it: more
			// than are left of the count confirmed. None is moved.
			more = true
			r.fail(c.id, c.n, fmt.Errorf("%w: %d dead letters hold it, and a change of an ID moves them all, "+
				"but only %d of the %d confirmed were left; it was not changed (confirm the change again for its new count)", ErrOverLimit, c.n, o.Limit-matched, o.Limit))
			return nil
		}
		matched += c.n
		if c.n > 1 {
			shared += c.n
		}
		batch = append(batch, idLetters{c.id, c.n})
		if len(batch) == o.PageSize {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	// eachID's Summary counts the lookups; the letters chosen are counted
	// here, as is a broker call's scan that stopped.
	r.Summary, r.Matched, r.Shared = s, matched, shared
	if r.Incomplete == "" {
		r.Incomplete = incomplete
	}
	r.Complete = s.Complete && !more && r.Incomplete == ""
	return r, err
}

// sweepApply is Apply on a broker that sweeps ([Sweeper]): one pass round
// the dead-letter queue chooses and moves, page by page. Past Limit it only
// looks, to say whether more would match.
func sweepApply(ctx context.Context, sw Sweeper, queue string, f Filter, act Action, o Options, progress func(int)) (Result, error) {
	o = o.withDefaults()
	var r Result
	seen := map[string]bool{} // of f.IDs
	more := false
	n, err := sw.SweepDeadLetters(ctx, queue, o.PageSize, act == Redrive, func(done int, page []*sdk.Message) []bool {
		if progress != nil && done > 0 {
			progress(done)
		}
		r.Scanned += len(page)
		now := o.Now()
		chosen := make([]bool, len(page))
		for i, m := range page {
			if len(f.IDs) > 0 && slices.Contains(f.IDs, m.ID) {
				seen[m.ID] = true
			}
			switch {
			case !f.Match(m, now):
			case o.Limit > 0 && r.Matched == o.Limit:
				more = true
			default:
				r.Matched++
				chosen[i] = true
			}
		}
		return chosen
	})
	r.Done = n
	miss := func(id string, err error) { r.fail(id, 1, err) }
	var pe *sdk.PublishError
	if errors.As(err, &pe) {
		// The chosen letters that failed, named even when an error ended
		// the sweep after them (the broker returns both).
		ids := slices.Sorted(maps.Keys(pe.Failed))
		for _, id := range ids {
			miss(id, pe.Failed[id])
		}
		err = without(err, pe)
	}
	notFound := sdk.ErrNotFound
	if ScanIncomplete(err) { // another walk cut this one short: a result, not a failure
		r.Incomplete, notFound, err = err.Error(), err, nil
	}
	if err == nil {
		for _, id := range unseen(f.IDs, seen) {
			miss(id, notFound)
		}
		if progress != nil {
			progress(r.Done)
		}
	}
	r.Complete = err == nil && !more && r.Incomplete == ""
	return r, err
}

// without returns err less pe, the failures it reports (see sweepApply),
// or less another error value it may join (errStreamLimit): nil when err is
// pe, the other errors when err joins pe to them (as rabbitmq.WalkError
// does), and err itself otherwise.
func without(err error, pe error) error {
	if err == pe {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return err
	}
	var rest []error
	for _, e := range j.Unwrap() {
		if e != pe {
			rest = append(rest, e)
		}
	}
	switch {
	case len(rest) == len(j.Unwrap()):
		return err
	case len(rest) == 0:
		return nil
	case len(rest) == 1:
		return rest[0]
	}
	return errors.Join(rest...)
}

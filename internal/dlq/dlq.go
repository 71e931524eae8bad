// Package dlq is what the berth command and its dashboard share to work on
// dead letters: a filter, a walk over a queue's dead letters page by page in
// bounded memory, and redrive or delete of the chosen ones with progress and
// a precise account of what was not done.
//
// Brokers are used through [sdk.DeadLetters] and the optional capabilities
// below, found by type assertion. The memory, PostgreSQL and JetStream
// brokers have all but [Sweeper]; RabbitMQ, which cannot page with a
// cursor, has [Sweeper]; on a broker with neither (SQS) a walk sees only
// the first [Options.ScanLimit] dead letters and says so
// ([Summary.Complete] false, [Summary.Incomplete] why), as does a change
// whose broker call reports that its own scan stopped before the end
// ([ScanIncomplete]).
package dlq

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/berthq/berth/sdk"
)

// Pager walks a queue's dead letters, oldest first: each call returns up to
// limit of them after cursor ("" for the first page) and the next page's
// cursor ("" after the last page). A cursor stays valid while the dead
// letters it passed are redriven or deleted.
type Pager interface {
	DeadLetterPage(ctx context.Context, queue, cursor string, limit int) ([]*sdk.Message, string, error)
}

// Bounded is a [Pager] that can stop a walk where the dead-letter queue
// ended when the walk began, which [Apply] uses for a redrive: a letter a
// consumer dead-letters again while the redrive runs comes back after that
// end, so the walk neither redrives it twice nor needs to remember which
// letters it redrove (its memory stays bounded however many it redrives).
// The memory, PostgreSQL and JetStream brokers have it.
//
// DeadLetterMark returns an opaque mark of the dead letters queue holds
// now ("" when it holds none). DeadLetterPageTo is DeadLetterPage
// restricted to the dead letters at or before mark: those dead-lettered
// (or dead-lettered again) after the mark was taken are not returned, and
// the next-page cursor is "" after the last page that reaches the mark. With
// the mark "" it returns no dead letters.
type Bounded interface {
	Pager
	DeadLetterMark(ctx context.Context, queue string) (mark string, err error)
	DeadLetterPageTo(ctx context.Context, queue, cursor, mark string, limit int) ([]*sdk.Message, string, error)
}

// Sweeper goes once round all of a queue's dead letters, pageSize at a time
// in bounded memory, acting on the chosen ones as it goes: what a broker
// that cannot page with a cursor offers instead of [Pager] (RabbitMQ, whose
// dead letters can be read only by taking them). fn is called with each
// page (it must not keep it) and how many it chose in earlier pages, and
// returns for each letter whether to act on it (nil: none); acting is
// redriving when redrive is true, deleting otherwise. It returns how many
// were acted on; chosen letters whose redrive failed are named by a
// *[sdk.PublishError]. A sweep ended by ctx finishes the page in hand.
type Sweeper interface {
	SweepDeadLetters(ctx context.Context, queue string, pageSize int, redrive bool, fn func(done int, page []*sdk.Message) []bool) (int, error)
}

// Progresser is a broker whose own redrive and purge of every dead letter
// go page by page and say, after each page that moved letters, how many
// they have moved so far (the SQS broker, whose dead-letter queue can be
// neither paged nor swept, and is moved at most 10 letters a receive).
// [Apply] uses it where it would call RedriveDeadLetters with no IDs or
// PurgeDeadLetters, so that a long redrive or purge of all shows progress.
// Each method moves exactly what the [sdk.DeadLetters] method does and
// returns the same count and error; progress, when not nil, is called on
// the caller's goroutine with the running count.
type Progresser interface {
	RedriveDeadLettersProgress(ctx context.Context, queue string, progress func(done int)) (int, error)
	PurgeDeadLettersProgress(ctx context.Context, queue string, progress func(done int)) (int, error)
}

// Streamer reads a queue's dead letters in one scan as ListDeadLetters does
// (at most limit of them), but hands them to fn a page at a time as it
// reads them instead of returning them all, so that a walk that keeps only
// some (a listed page, a preview's first ones) holds no more in memory (the
// SQS broker, whose scan reads up to [Options.ScanLimit] whole letters).
// The letters it read stay held by the scan until it ends, so fn must not
// look them up or change them through the broker: [List] and [Preview] use
// it; [Apply], whose pages are redriven or deleted by ID, uses it to keep
// the letters without their bodies until the scan ends, then changes them;
// [Walk] (whose fn may call the broker) does not. An error of fn ends the
// scan and is returned.
type Streamer interface {
	StreamDeadLetters(ctx context.Context, queue string, limit int, fn func(page []*sdk.Message) error) error
}

// Deleter deletes chosen dead letters. An unknown id gives an error
// wrapping [sdk.ErrNotFound] and then nothing is deleted.
type Deleter interface {
	DeleteDeadLetters(ctx context.Context, queue string, ids ...string) (int, error)
}

// IDCounter counts the dead letters of queue holding the message ID id
// (0 when none does). Brokers move every dead letter holding an ID they are
// given (a producer may reuse an ID, a message may be dead-lettered twice,
// foreign messages may all have the empty one), so a change of chosen IDs
// ([Preview], [Apply]) counts, and is limited by, the letters they hold: on
// a broker without IDCounter that count takes a walk of the dead-letter
// queue. The memory, PostgreSQL and JetStream brokers have it.
type IDCounter interface {
	CountDeadLetters(ctx context.Context, queue, id string) (int, error)
}

// IDsCounter is an [IDCounter] that counts the dead letters of many IDs in
// one call: for each distinct ID of ids, how many dead letters of queue
// hold it (an ID none holds may be left out of the map). A change chosen by
// a filter without IDs ([Apply], and the count [Preview] confirms it with)
// counts the IDs of each page of letters it would move with one call, to
// hold back an ID that letters it did not choose hold too (see
// [ErrSharedID]); on an IDCounter without it each ID is counted alone. The
// memory and PostgreSQL brokers have it.
type IDsCounter interface {
	CountDeadLettersByID(ctx context.Context, queue string, ids []string) (map[string]int, error)
}

// ErrSharedID is wrapped by the [Failure] of the letters a change chosen by
// a filter without IDs matched but did not move: brokers move dead letters
// by ID, every letter holding an ID they are given, and other dead letters,
// which the filter did not choose (or that lay past [Options.Limit]), hold
// their ID too. A change of the ID by name moves them all.
var ErrSharedID = errors.New("dead letters the change did not choose hold this ID too")

// ErrOverLimit is wrapped by the [Failure] of a chosen ID that [Apply] did
// not change because the dead letters holding it, all of which a change of
// it moves, are more than what was left of [Options.Limit] (the count an
// operator confirmed): a change never touches more letters than its Limit.
var ErrOverLimit = errors.New("more dead letters hold this ID than the change may touch")

// QueueLister lists a broker's queues.
type QueueLister interface {
	Queues(ctx context.Context) ([]string, error)
}

// Filter chooses dead letters. Its zero value matches every one; each set
// field narrows the choice.
type Filter struct {
	IDs       []string       // message IDs
	Types     []string       // message types, exactly
	Class     string         // the berth-dlq-class header, exactly (permanent, transient, …)
	Reason    string         // a substring of the berth-dlq-reason header
	ReasonRE  *regexp.Regexp // or a regexp it matches
	OlderThan time.Duration  // last failure more than this long ago
	NewerThan time.Duration  // last failure less than this long ago
}

// ErrBadFilter is wrapped by the error of a filter that cannot be built.
var ErrBadFilter = errors.New("bad filter")

// ParseReason sets f's reason: "/re/" is a regexp, anything else a substring.
func (f *Filter) ParseReason(s string) error {
	if len(s) >= 2 && strings.HasPrefix(s, "/") && strings.HasSuffix(s, "/") {
		re, err := regexp.Compile(s[1 : len(s)-1])
		if err != nil {
			return fmt.Errorf("%w: -reason: %v", ErrBadFilter, err)
		}
		f.ReasonRE, f.Reason = re, ""
		return nil
	}
	f.Reason, f.ReasonRE = s, nil
	return nil
}

// IsZero reports whether f matches every dead letter.
func (f Filter) IsZero() bool {
	return len(f.IDs) == 0 && len(f.Types) == 0 && f.Class == "" && f.Reason == "" && f.ReasonRE == nil &&
		f.OlderThan == 0 && f.NewerThan == 0
}

// Match reports whether m is chosen, at time now.
func (f Filter) Match(m *sdk.Message, now time.Time) bool {
	if len(f.IDs) > 0 && !slices.Contains(f.IDs, m.ID) {
		return false
	}
	if len(f.Types) > 0 && !slices.Contains(f.Types, m.Type) {
		return false
	}
	if f.Class != "" && m.Header(sdk.HeaderDeadLetterClass) != f.Class {
		return false
	}
	reason := m.Header(sdk.HeaderDeadLetterReason)
	if f.Reason != "" && !strings.Contains(reason, f.Reason) {
		return false
	}
	if f.ReasonRE != nil && !f.ReasonRE.MatchString(reason) {
		return false
	}
	if f.OlderThan > 0 || f.NewerThan > 0 {
		at, ok := LastFailure(m)
		if !ok {
			return false
		}
		age := now.Sub(at)
		if f.OlderThan > 0 && age <= f.OlderThan {
			return false
		}
		if f.NewerThan > 0 && age >= f.NewerThan {
			return false
		}
	}
	return true
}

// LastFailure returns the time of the failure that dead-lettered m.
func LastFailure(m *sdk.Message) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, m.Header(sdk.HeaderLastFailure))
	return t, err == nil
}

// Options bound a walk.
type Options struct {
	// PageSize is how many dead letters are read at a time. Default 500.
	PageSize int
	// ScanLimit bounds how many dead letters are read from a broker with
	// neither [Pager] nor [Sweeper] (in one ListDeadLetters call). Default
	// 10000.
	ScanLimit int
	// Limit, when positive, stops after this many matches.
	Limit int
	// Now is the clock of the age filters. Default time.Now.
	Now func() time.Time
	// Scanned, when set, is called by [Walk] and [Preview] with the running
	// count of dead letters read, after each page (or looked-up ID): the
	// progress of a scan, which on a large dead-letter queue takes a while.
	Scanned func(n int)
}

func (o Options) scanned(n int) {
	if o.Scanned != nil {
		o.Scanned(n)
	}
}

func (o Options) withDefaults() Options {
	if o.PageSize <= 0 {
		o.PageSize = 500
	}
	if o.ScanLimit <= 0 {
		o.ScanLimit = 10000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Summary counts a walk.
type Summary struct {
	Scanned int // dead letters read
	Matched int // of them, chosen by the filter (up to Options.Limit)
	// Complete: every dead letter of the queue was looked at (false: the
	// broker cannot page past ScanLimit, its scan stopped, or Limit stopped
	// the walk with more to match). For an [Apply] redrive on a [Bounded]
	// broker, every one the queue held when the redrive began: those
	// dead-lettered while it ran were left for the next one.
	Complete bool
	// Incomplete says why the walk, or a broker call of a change, stopped
	// before the end of the dead-letter queue when Limit did not stop it:
	// more dead letters than Matched may match. "" otherwise.
	Incomplete string
	// Shared is how many of the Matched letters, chosen by ID, share it
	// with other dead letters: a change of an ID moves every letter holding
	// it, so each is counted (see [IDCounter]).
	Shared int
	// Withheld is how many of the Matched letters, chosen by a filter
	// without IDs, a change leaves: dead letters it did not choose hold
	// their ID too, and the broker would move those with them (see
	// [ErrSharedID]). [Apply] counts them in Missed, and an Apply that an
	// error stopped those it had held back by then. A broker with
	// [IDCounter] tells, and on one with neither Pager nor Sweeper (SQS)
	// the letters of the scan are counted by ID (a change reads them all
	// before it moves any); on a [Sweeper], which moves letter by letter,
	// it is 0.
	Withheld int
	// WithheldIDs names the IDs of the Withheld letters, as the change
	// would report them (each a Failure wrapping [ErrSharedID], with the
	// text of [Apply]'s), in the order met: at most [MaxFailures] of them
	// (Withheld counts every letter). [Preview] fills it; [Apply] reports
	// them in Result.Failed and leaves it nil.
	WithheldIDs []Failure
}

// ScanIncomplete reports whether err is a broker's report that its own
// dead-letter scan stopped before the end of the queue (an SQS scan that
// would hold too many letters, a RabbitMQ walk another walk cut short):
// not a failure of the broker, but a reason the operator must run the
// command again. It looks for the sentinel those errors wrap,
// sqs.ErrScanIncomplete or rabbitmq.ErrScanIncomplete, by its text: this
// package, which the dashboard imports, imports no broker (see
// ARCHITECTURE.md), and a test pins the texts to the brokers' sentinels.
func ScanIncomplete(err error) bool {
	if err == nil {
		return false
	}
	if slices.Contains(scanIncompleteTexts, err.Error()) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return ScanIncomplete(u.Unwrap())
	case interface{ Unwrap() []error }:
		return slices.ContainsFunc(u.Unwrap(), ScanIncomplete)
	}
	return false
}

// scanIncompleteTexts are the texts of sqs.ErrScanIncomplete and
// rabbitmq.ErrScanIncomplete.
var scanIncompleteTexts = []string{
	"berth/sqs: dead-letter scan incomplete",
	"berth/rabbitmq: dead-letter walk incomplete",
}

// Walk calls fn with the chosen dead letters of queue, page by page, oldest
// first; fn must not keep the slice. It stops at the first error of the
// broker or fn, or when ctx is done (returning ctx.Err()), with the summary
// so far.
func Walk(ctx context.Context, dl sdk.DeadLetters, queue string, f Filter, o Options, fn func([]*sdk.Message) error) (Summary, error) {
	return walk(ctx, dl, queue, f, o, walkMode{}, fn)
}

// walkMode is how [Apply] walks, beyond what [Walk] does.
type walkMode struct {
	// toMark stops the walk, on a [Bounded] broker, where the dead-letter
	// queue ended when it began (Complete then means every dead letter up
	// to there was looked at).
	toMark bool
	// skip, when set, passes over the letters it reports (a letter Apply
	// has already redriven): read (Scanned), but neither matched nor given
	// to fn. Only the Pager and ListDeadLetters walks use it.
	skip func(*sdk.Message) bool
	// stream reads a broker with neither Pager nor Sweeper through
	// [Streamer], when it is one: fn is handed each page as the broker's
	// scan reads it, while the scan holds the letters it read, so fn must
	// not call the broker on them.
	stream bool
	// light: fn reads no letter's body (Apply reads only IDs). A broker
	// with neither Pager nor Sweeper that is a [Streamer] is then read
	// through it and its letters kept without their bodies until the scan
	// ends, in place of the whole letters ListDeadLetters returns: an
	// SQS dead-letter queue of ScanLimit letters of 256 KiB was gigabytes.
	light bool
	// count, when set, is given every letter the walk reads of a broker
	// with neither Pager nor Sweeper, chosen or not: on the light and
	// ListDeadLetters walks the whole scan before any page is given to
	// fn; on the streamed one as read, the scan then reading on past Limit
	// to its end (only counting). An [idGuard] counts each ID's letters
	// so (see newIDGuard).
	count func(page []*sdk.Message)
}

// errStreamLimit ends a [Streamer]'s scan once Limit matches were found.
var errStreamLimit = errors.New("dlq: limit reached")

// walk is [Walk] in mode w.
func walk(ctx context.Context, dl sdk.DeadLetters, queue string, f Filter, o Options, w walkMode, fn func([]*sdk.Message) error) (Summary, error) {
	o = o.withDefaults()
	var s Summary
	emit := func(page []*sdk.Message) (bool, error) {
		now := o.Now()
		chosen := page[:0:0]
		for _, m := range page {
			if o.Limit > 0 && s.Matched == o.Limit {
				break
			}
			if w.skip != nil && w.skip(m) {
				continue
			}
			if f.Match(m, now) {
				chosen = append(chosen, m)
				s.Matched++
			}
		}
		if len(chosen) > 0 {
			if err := fn(chosen); err != nil {
				return true, err
			}
		}
		return o.Limit > 0 && s.Matched == o.Limit, nil
	}
	p, ok := dl.(Pager)
	if sw, isSweeper := dl.(Sweeper); !ok && isSweeper {
		// The sweep goes round to the end whatever the filter and Limit
		// (stopping half way would leave the queue turned): past Limit it
		// only looks, to say whether more would match.
		var ferr error
		more := false
		_, err := sw.SweepDeadLetters(ctx, queue, o.PageSize, false, func(_ int, page []*sdk.Message) []bool {
			s.Scanned += len(page)
			o.scanned(s.Scanned)
			if ferr != nil {
				return nil
			}
			if o.Limit > 0 && s.Matched == o.Limit {
				more = more || slices.ContainsFunc(page, func(m *sdk.Message) bool { return f.Match(m, o.Now()) })
				return nil
			}
			before := s.Matched
			_, ferr = emit(page)
			if o.Limit > 0 && s.Matched == o.Limit {
				now, n := o.Now(), 0
				for _, m := range page {
					if f.Match(m, now) {
						n++
					}
				}
				more = n > s.Matched-before
			}
			return nil
		})
		if ScanIncomplete(err) { // another walk cut this one short
			s.Incomplete, err = err.Error(), nil
		}
		if err == nil {
			err = ferr
		}
		s.Complete = err == nil && !more && s.Incomplete == ""
		return s, err
	}
	if st, streams := dl.(Streamer); !ok && streams && w.stream {
		limited := false
		err := st.StreamDeadLetters(ctx, queue, o.ScanLimit, func(page []*sdk.Message) error {
			s.Scanned += len(page)
			o.scanned(s.Scanned)
			if w.count != nil {
				w.count(page)
			}
			if limited {
				return ctx.Err() // past Limit: only counted
			}
			stop, err := emit(page)
			if err != nil {
				return err
			}
			if stop {
				limited = true
				if w.count == nil {
					return errStreamLimit
				}
			}
			return ctx.Err()
		})
		if limited {
			err = without(err, errStreamLimit)
		}
		switch {
		case err != nil && !ScanIncomplete(err):
			return s, err
		case limited:
			s.Complete, s.Incomplete = false, "" // Limit stopped it
			return s, nil
		case err != nil:
			s.Incomplete = err.Error()
		case s.Scanned >= o.ScanLimit:
			s.Incomplete = fmt.Sprintf("the broker cannot page its dead letters: only the first %d were read", o.ScanLimit)
		}
		s.Complete = s.Incomplete == ""
		return s, nil
	}
	if !ok {
		var page []*sdk.Message
		var err error
		if st, streams := dl.(Streamer); streams && w.light {
			err = st.StreamDeadLetters(ctx, queue, o.ScanLimit, func(read []*sdk.Message) error {
				for _, m := range read {
					c := *m
					c.Body = nil // the filter reads headers, fn only IDs
					page = append(page, &c)
				}
				o.scanned(len(page))
				return ctx.Err()
			})
		} else {
			page, err = dl.ListDeadLetters(ctx, queue, o.ScanLimit)
		}
		switch {
		case ScanIncomplete(err):
			s.Incomplete = err.Error()
		case err != nil:
			return s, err
		case len(page) >= o.ScanLimit:
			s.Incomplete = fmt.Sprintf("the broker cannot page its dead letters: only the first %d were read", o.ScanLimit)
		}
		s.Scanned = len(page)
		o.scanned(s.Scanned)
		s.Complete = s.Incomplete == ""
		if w.count != nil {
			w.count(page)
		}
		for len(page) > 0 {
			n := min(len(page), o.PageSize)
			stop, err := emit(page[:n])
			if err != nil {
				return s, err
			}
			if stop {
				s.Complete, s.Incomplete = false, "" // Limit stopped it
				return s, nil
			}
			page = page[n:]
			if err := ctx.Err(); err != nil {
				return s, err
			}
		}
		return s, nil
	}
	pageFn := p.DeadLetterPage
	if b, ok := dl.(Bounded); ok && w.toMark {
		mark, err := b.DeadLetterMark(ctx, queue)
		if err != nil {
			return s, err
		}
		pageFn = func(ctx context.Context, queue, cursor string, limit int) ([]*sdk.Message, string, error) {
			return b.DeadLetterPageTo(ctx, queue, cursor, mark, limit)
		}
	}
	cursor := ""
	for {
		if err := ctx.Err(); err != nil {
			return s, err
		}
		page, next, err := pageFn(ctx, queue, cursor, o.PageSize)
		if err != nil {
			return s, err
		}
		s.Scanned += len(page)
		o.scanned(s.Scanned)
		stop, err := emit(page)
		if err != nil {
			return s, err
		}
		if stop {
			return s, nil // Complete stays false: there may be more matches
		}
		if next == "" {
			s.Complete = true
			return s, nil
		}
		cursor = next
	}
}

// Preview counts the dead letters f chooses without changing anything and
// returns the first keep of them. With IDs in f, each is looked up and the
// IDs that are not dead letters of queue are returned as missing; a chosen
// ID counts every dead letter holding it, which a change of it moves (see
// [IDCounter]; Summary.Shared says how many share one), and with
// [Options.Limit] an ID whose letters do not all fit in what is left of it
// is not counted, as [Apply] does not change it. (On a broker without
// IDCounter the letters are counted by a walk of the dead-letter queue:
// when it stops before the end, Incomplete says so and a count may be
// short.)
//
// Without IDs in f, Matched counts every letter f chooses (up to Limit: a
// change confirmed for it is given Matched as its Limit) and Withheld those
// of them [Apply] would not move, their ID held by dead letters f does not
// choose too (see [ErrSharedID]), WithheldIDs naming their IDs as Apply
// would; first leaves them out. (On a broker with
// neither Pager nor Sweeper, SQS, that count takes every letter of the scan,
// which the change reads before it moves any: past Limit the scan reads on
// to its end, only counting each ID's letters.)
func Preview(ctx context.Context, dl sdk.DeadLetters, queue string, f Filter, o Options, keep int) (s Summary, first []*sdk.Message, missing []string, err error) {
	o = o.withDefaults()
	_, paged := dl.(Pager)
	if _, ok := dl.(Sweeper); ok && !paged && len(f.IDs) > 0 {
		// One sweep finds every ID, instead of one per ID.
		seen := map[string]bool{}
		rest, all := f, o
		rest.IDs, all.Limit = nil, 0
		matched, more := 0, false
		s, err = Walk(ctx, dl, queue, Filter{IDs: f.IDs}, all, func(page []*sdk.Message) error {
			now := o.Now()
			for _, m := range page {
				seen[m.ID] = true
				switch {
				case !rest.Match(m, now):
				case o.Limit > 0 && matched == o.Limit:
					more = true
				default:
					matched++
					if len(first) < keep {
						first = append(first, m)
					}
				}
			}
			return nil
		})
		s.Matched, s.Complete = matched, s.Complete && !more
		if err == nil {
			missing = unseen(f.IDs, seen)
		}
		return s, first, missing, err
	}
	if len(f.IDs) == 0 {
		// Streamed: it keeps only the first keep letters, not every one read.
		// The letters Apply would hold back, their ID held by letters not
		// chosen too, are counted as it counts them (Withheld) and left
		// out of first.
		guard := newIDGuard(dl, queue, f, o)
		mode := walkMode{stream: true}
		var chosen []*sdk.Message // a streamed scan's chosen letters, bodyless, for the guard once it ends
		if guard != nil && guard.totals != nil {
			// The guard counts the scan's letters by ID, known only once it
			// ends (as Apply's scan reads them all before it moves any).
			mode.count = guard.scanned
		}
		s, err = walk(ctx, dl, queue, f, o, mode, func(page []*sdk.Message) error {
			switch {
			case guard != nil && guard.totals != nil:
				for _, m := range page {
					chosen = append(chosen, &sdk.Message{ID: m.ID})
				}
			case guard != nil:
				if _, err := guard.page(ctx, page); err != nil {
					return err
				}
			}
			for _, m := range page {
				if len(first) < keep {
					first = append(first, m)
				}
			}
			return nil
		})
		if guard != nil && guard.totals != nil && err == nil && len(chosen) > 0 {
			_, err = guard.page(ctx, chosen)
		}
		if guard != nil && err == nil {
			held := map[string]bool{}
			for _, h := range guard.held() {
				s.Withheld += h.chosen
				held[h.id] = true
				if len(s.WithheldIDs) < MaxFailures {
					s.WithheldIDs = append(s.WithheldIDs, Failure{ID: h.id, Err: h.err(false)})
				}
			}
			first = slices.DeleteFunc(first, func(m *sdk.Message) bool { return held[m.ID] })
		}
		return s, first, nil, err
	}
	matched, shared, more := 0, 0, false
	s, err = eachID(ctx, dl, queue, f, o, keep, func(c idCount) error {
		switch {
		case errors.Is(c.err, sdk.ErrNotFound):
			missing = append(missing, c.id)
		case c.err != nil: // a ScanIncomplete: neither found nor known to be missing
		case !c.chosen:
		case o.Limit > 0 && matched+c.n > o.Limit:
			more = true // past Limit it only looks, as Apply does: for the missing IDs
		default:
			matched += c.n
			if c.n > 1 {
				shared += c.n
			}
			if c.m != nil && len(first) < keep {
				first = append(first, c.m)
			}
		}
		return nil
	})
	s.Matched, s.Shared, s.Complete = matched, shared, s.Complete && !more
	return s, first, missing, err
}

// idCount is what [eachID] found of one chosen ID.
type idCount struct {
	id string
	// chosen: the rest of the filter matches the letter that decides
	// (the one GetDeadLetter returns, or the first a walk meets).
	chosen bool
	// n is how many dead letters hold id: a change of it moves them all.
	n int
	// m is a letter holding id, or nil (a walk keeps only the first keep
	// chosen).
	m *sdk.Message
	// err: the lookup failed with an error wrapping [sdk.ErrNotFound], or
	// one of a broker's scan that stopped ([ScanIncomplete]).
	err error
}

// eachID calls fn, in order, with what it finds of each distinct ID of
// f.IDs, for [Preview] and [Apply]: whether the rest of f chooses it and how
// many dead letters hold it. A broker with [IDCounter] is asked for each ID
// (GetDeadLetter, then CountDeadLetters); on another one dead-letter walk
// counts the letters of every ID at once, and an ID it did not meet is
// looked up (GetDeadLetter: an SQS letter is named by its MessageId too, one
// letter each). It returns the Summary of the lookups (Scanned, and
// Complete and Incomplete; the caller counts Matched) and stops at the
// first error of the broker (not a lookup's ErrNotFound or ScanIncomplete,
// given to fn) or of fn.
func eachID(ctx context.Context, dl sdk.DeadLetters, queue string, f Filter, o Options, keep int, fn func(idCount) error) (Summary, error) {
	rest := f
	rest.IDs = nil
	s := Summary{Complete: true}
	lookup := func(id string) (idCount, error) {
		c := idCount{id: id, n: 1}
		c.m, c.err = dl.GetDeadLetter(ctx, queue, id)
		s.Scanned++
		o.scanned(s.Scanned)
		switch {
		case errors.Is(c.err, sdk.ErrNotFound):
			return c, nil
		case ScanIncomplete(c.err):
			s.Complete, s.Incomplete = false, c.err.Error()
			return c, nil
		case c.err != nil:
			return c, c.err
		}
		c.chosen = rest.Match(c.m, o.Now())
		return c, nil
	}
	var walked map[string]*idCount
	counter, counts := dl.(IDCounter)
	if !counts {
		// One walk counts the letters of every ID.
		walked = make(map[string]*idCount, len(f.IDs))
		for _, id := range f.IDs {
			walked[id] = &idCount{id: id}
		}
		kept := 0
		all := o
		all.Limit = 0
		// Streamed on a [Streamer] (fn only counts, and keeps at most keep
		// letters): a scan of ScanLimit whole letters is not held.
		ws, err := walk(ctx, dl, queue, Filter{IDs: f.IDs}, all, walkMode{stream: true}, func(page []*sdk.Message) error {
			now := o.Now()
			for _, m := range page {
				c := walked[m.ID]
				if c.n == 0 { // the first (oldest) letter holding it decides, as GetDeadLetter's does
					c.chosen = rest.Match(m, now)
					if c.chosen && kept < keep {
						c.m, kept = m, kept+1
					}
				}
				c.n++
			}
			return nil
		})
		s.Scanned = ws.Scanned
		if err != nil {
			return s, err
		}
		if ws.Incomplete != "" {
			// The walk did not see every letter: an ID's count is a
			// lower bound.
			s.Complete, s.Incomplete = false, ws.Incomplete
		}
	}
	seen := map[string]bool{}
	for _, id := range f.IDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		if err := ctx.Err(); err != nil {
			return s, err
		}
		var c idCount
		switch {
		case walked != nil && walked[id].n > 0:
			c = *walked[id]
		default:
			var err error
			if c, err = lookup(id); err != nil {
				return s, err
			}
			if c.err != nil || !counts {
				break // not found, or a letter the walk did not meet: at least the one found
			}
			n, err := counter.CountDeadLetters(ctx, queue, id)
			if err != nil {
				return s, err
			}
			c.n = max(n, 1) // at least the one found: one gone since is the change's to report
		}
		if err := fn(c); err != nil {
			return s, err
		}
	}
	return s, nil
}

// unseen returns the IDs of ids (each once, in order) that seen lacks.
func unseen(ids []string, seen map[string]bool) []string {
	var out []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

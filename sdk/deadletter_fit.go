package sdk

import (
	"strings"
	"unicode/utf8"
)

// deadLetterNotes are the annotations [AnnotateDeadLetter] writes, which
// FitDeadLetter leaves out when even an empty reason does not fit.
var deadLetterNotes = [...]string{HeaderDeadLetterReason, HeaderDeadLetterClass, HeaderDeadLetterAttempts,
	HeaderDeadLetterQueue, HeaderFirstFailure, HeaderLastFailure}

// FitDeadLetter shortens the annotations of m, a copy annotated by
// [AnnotateDeadLetter], until size(m) is at most limit, never the message
// itself: first the reason (cut on a rune boundary to the longest prefix
// with which the copy fits, marked with "…", or left out), then every
// annotation; m is then marked with [HeaderDeadLetterTruncated]. A dead
// letter with a short reason is better than one that cannot be stored,
// whose message would be delivered again for ever. When even the copy
// without annotations is over limit it returns a [*MessageTooLargeError]
// (the message stays where it is). It returns size's error as it is.
//
// size returns the size of m as the broker would store it, in the unit of
// limit (bytes of a payload, of a frame). It is called last on m as
// FitDeadLetter leaves it, so a broker can keep what it encoded in that
// call. A copy that fits at once costs one call; one that does not,
// about log2 of the reason's length more.
func FitDeadLetter(m *Message, limit int, size func(*Message) (int, error)) error {
	if n, err := size(m); err != nil || n <= limit {
		return err
	}
	// The reason, cut to the longest prefix with which the copy fits (by
	// bisection: an escape can make one byte of it several in the
	// encoding). Its full length does not fit: that is the copy above.
	reason := strings.TrimSuffix(m.Header(HeaderDeadLetterReason), "…")
	m.SetHeader(HeaderDeadLetterTruncated, "reason")
	fits := func(k int) (bool, error) {
		for k > 0 && k < len(reason) && !utf8.RuneStart(reason[k]) {
			k--
		}
		if k == 0 {
			delete(m.Headers, HeaderDeadLetterReason)
		} else {
			m.SetHeader(HeaderDeadLetterReason, reason[:k]+"…")
		}
		n, err := size(m)
		return n <= limit, err
	}
	ok, err := fits(0)
	if err != nil {
		return err
	}
	if ok {
		lo, hi := 0, len(reason) // lo fits, hi does not
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			if ok, err := fits(mid); err != nil {
				return err
			} else if ok {
				lo = mid
			} else {
				hi = mid
			}
		}
		_, err := fits(lo) // as it did in the bisection: the last size call is m's
		return err
	}
	for _, h := range deadLetterNotes {
		delete(m.Headers, h)
	}
	m.SetHeader(HeaderDeadLetterTruncated, "all")
	n, err := size(m)
	if err != nil {
		return err
	}
	if n > limit {
		return &MessageTooLargeError{ID: m.ID, Size: n, Limit: limit}
	}
	return nil
}

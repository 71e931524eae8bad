package sqs

import (
	"strings"
	"unicode/utf8"

	"github.com/berthq/berth/sdk"
)

// HeaderDeadLetterTruncated marks a dead letter whose annotations berth
// shortened so that it fits [Options.MaxWireSize]: "reason" when the
// [sdk.HeaderDeadLetterReason] was cut (or left out), "all" when every
// dead-letter annotation was left out. The message itself (ID, fields,
// headers, body) is always sent as it was. A redrive removes it. It is the
// header the JetStream broker writes in the same case.
const HeaderDeadLetterTruncated = "berth-dlq-truncated"

// copyReserve is what Publish keeps of [Options.MaxWireSize], beyond a
// message's own encoded size, so that every copy berth sends of an accepted
// message fits too: its dead letter (at the least with its annotations left
// out, see [fitDeadLetter]) and a redrive. Such a copy differs from the
// published message only in its headers: at most a [sdk.HeaderRedriveCount]
// of 20 digits and a [HeaderDeadLetterTruncated], with the `,"h":{}` around
// them when the message had no headers. Its body, fields and other headers
// are the message's, and a FIFO deduplication ID is not counted by SQS.
//
// The alternative, refusing nothing at Publish, leaves a message within a
// few dozen bytes of the limit that no DeadLetter can send: the Worker's
// dead-lettering fails, the message comes back until SQS's redrive policy
// moves it without berth's reason. With the reserve DeadLetter has only its
// own annotations to shorten, and a redrive nothing. It costs such a
// message a typed [sdk.MessageTooLargeError] at Publish instead.
const copyReserve = len(`,"h":{}`) +
	len(`,"":""`) + len(sdk.HeaderRedriveCount) + 20 +
	len(`,"":""`) + len(HeaderDeadLetterTruncated) + len("reason")

// deadLetterNotes are the annotations [sdk.AnnotateDeadLetter] writes,
// which fitDeadLetter leaves out when even an empty reason does not fit.
var deadLetterNotes = [...]string{sdk.HeaderDeadLetterReason, sdk.HeaderDeadLetterClass, sdk.HeaderDeadLetterAttempts,
	sdk.HeaderDeadLetterQueue, sdk.HeaderFirstFailure, sdk.HeaderLastFailure}

// fitDeadLetter shortens the annotations of m, a message annotated as a dead
// letter whose encoded size is over limit, never the message: first the
// reason (cut to the longest prefix with which the copy fits, or left out),
// then every annotation, and marks m with [HeaderDeadLetterTruncated]. A
// dead letter with a short reason is better than one that cannot be sent,
// whose message would be delivered again until SQS's redrive policy moves
// it without berth's annotations. Publish keeps room for the shortest form
// ([copyReserve]), so only a foreign producer's message (whose dead letter
// gets berth's envelope) can still be too large: a
// [*sdk.MessageTooLargeError], and the message stays where it is.
func fitDeadLetter(m *sdk.Message, limit int) error {
	body, bodyEnc := encodeBody(m.Body)
	size := func() (int, error) {
		v, err := encodeAttr(m, bodyEnc)
		return wireLen(body, v), err
	}
	if n, err := size(); err != nil || n <= limit {
		return err
	}
	// The reason, cut to the longest prefix with which the copy fits (by
	// bisection: JSON escapes make a byte of it one to six on the wire).
	// Its full length does not fit: that is the copy measured above.
	reason := strings.TrimSuffix(m.Header(sdk.HeaderDeadLetterReason), "…")
	m.SetHeader(HeaderDeadLetterTruncated, "reason")
	fits := func(k int) (bool, error) {
		for k > 0 && k < len(reason) && !utf8.RuneStart(reason[k]) {
			k--
		}
		if k == 0 {
			delete(m.Headers, sdk.HeaderDeadLetterReason)
		} else {
			m.SetHeader(sdk.HeaderDeadLetterReason, reason[:k]+"…")
		}
		n, err := size()
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
		_, err := fits(lo) // as it did in the bisection
		return err
	}
	for _, h := range deadLetterNotes {
		delete(m.Headers, h)
	}
	m.SetHeader(HeaderDeadLetterTruncated, "all")
	n, err := size()
	if err != nil {
		return err
	}
	if n > limit {
		return &sdk.MessageTooLargeError{ID: m.ID, Size: n, Limit: limit}
	}
	return nil
}

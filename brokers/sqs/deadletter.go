package sqs

import "github.com/berthq/berth/sdk"

// HeaderDeadLetterTruncated marks a dead letter whose annotations berth
// shortened so that it fits [Options.MaxWireSize] (see
// [sdk.HeaderDeadLetterTruncated]). A redrive removes it.
const HeaderDeadLetterTruncated = sdk.HeaderDeadLetterTruncated

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
// which [sdk.FitDeadLetter] leaves out when even an empty reason does not
// fit.
var deadLetterNotes = [...]string{sdk.HeaderDeadLetterReason, sdk.HeaderDeadLetterClass, sdk.HeaderDeadLetterAttempts,
	sdk.HeaderDeadLetterQueue, sdk.HeaderFirstFailure, sdk.HeaderLastFailure}

// fitDeadLetter shortens the annotations of m, a message annotated as a dead
// letter whose encoded size is over limit, never the message
// ([sdk.FitDeadLetter]): first the
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
	return sdk.FitDeadLetter(m, limit, func(m *sdk.Message) (int, error) {
		v, err := encodeAttr(m, bodyEnc)
		return wireLen(body, v), err
	})
}

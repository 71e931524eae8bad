package rabbitmq

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthq/berth/sdk"
)

// Headers berth uses on the wire for Message fields that AMQP has no
// property for.
const (
	headerIdempotencyKey = "berth-idempotency-key"
	headerKey            = "berth-key"
)

// brokerHeaders are set by RabbitMQ itself; a message cannot carry them
// and they are not handed to applications.
var brokerHeaders = map[string]bool{
	"x-death": true, "x-delivery-count": true,
	"x-first-death-exchange": true, "x-first-death-queue": true, "x-first-death-reason": true,
	"x-last-death-exchange": true, "x-last-death-queue": true, "x-last-death-reason": true,
	"x-received-from": true,
	// Sender-selected distribution: RabbitMQ would route by them and strip BCC.
	"CC": true, "BCC": true,
}

// maxShortString is AMQP's limit for property values and header names.
const maxShortString = 255

// validate checks what sdk.Prepare does not: what AMQP 0-9-1 and RabbitMQ
// cannot carry.
func validate(m *sdk.Message) error {
	for k := range m.Headers {
		if brokerHeaders[k] {
			return &sdk.HeaderError{Name: k, Reason: "reserved by RabbitMQ"}
		}
		if len(k) > maxShortString {
			return &sdk.HeaderError{Name: k[:32] + "…", Reason: "name longer than 255 bytes"}
		}
	}
	// An array, not a map: no hashing on every publish, and the field an
	// error names does not depend on map order.
	for _, f := range [...]struct{ name, v string }{{"ID", m.ID}, {"Type", m.Type}, {"CorrelationID", m.CorrelationID}} {
		if len(f.v) > maxShortString {
			return fmt.Errorf("%w: %s longer than 255 bytes (an AMQP short string)", sdk.ErrInvalidMessage, f.name)
		}
	}
	return nil
}

// encode returns the AMQP publishing for m, with attempt in the attempt
// header when above 1.
func encode(m *sdk.Message, attempt int, now time.Time) amqp.Publishing {
	var h amqp.Table // nil when there is nothing to carry: no map to build, none to encode
	if n := len(m.Headers); n > 0 || m.IdempotencyKey != "" || m.Key != "" || attempt > 1 {
		h = make(amqp.Table, n+3)
	}
	for k, v := range m.Headers {
		h[k] = v
	}
	delete(h, sdk.HeaderAttempt)
	if m.IdempotencyKey != "" {
		h[headerIdempotencyKey] = m.IdempotencyKey
	}
	if m.Key != "" {
		h[headerKey] = m.Key
	}
	if attempt > 1 {
		h[sdk.HeaderAttempt] = strconv.Itoa(attempt)
	}
	return amqp.Publishing{
		Headers:       h,
		DeliveryMode:  amqp.Persistent,
		MessageId:     m.ID,
		Type:          m.Type,
		CorrelationId: m.CorrelationID,
		Timestamp:     now,
		Body:          m.Body,
	}
}

// carried is what a copy berth publishes of a delivered message (Retry,
// Release, DeadLetter, redrive, Close's hand-back) keeps of it although
// Message cannot hold it: non-string header values and the AMQP properties
// that a producer outside berth may set. The copy is built from the Message
// (encode); apply puts these back, so that nothing of the message is lost
// on the way. Not the expiration (a per-message TTL would start again on
// the copy, and could expire a dead letter) nor the user ID (the server
// checks it against the login).
type carried struct {
	headers         amqp.Table // see decoded.extra
	contentType     string
	contentEncoding string
	appID           string
	replyTo         string
	priority        uint8
}

// carriedOf returns what copies of d keep; extra is decode's.
func carriedOf(d amqp.Delivery, extra amqp.Table) carried {
	return carried{headers: extra, contentType: d.ContentType, contentEncoding: d.ContentEncoding,
		appID: d.AppId, replyTo: d.ReplyTo, priority: d.Priority}
}

// apply adds to p, a copy encode made, the properties of c and the headers
// of c that p does not carry.
func (c carried) apply(p amqp.Publishing) amqp.Publishing {
	p.ContentType, p.ContentEncoding, p.AppId, p.ReplyTo, p.Priority =
		c.contentType, c.contentEncoding, c.appID, c.replyTo, c.priority
	if len(c.headers) == 0 {
		return p
	}
	if p.Headers == nil {
		p.Headers = make(amqp.Table, len(c.headers))
	}
	for k, v := range c.headers {
		if _, ok := p.Headers[k]; !ok {
			p.Headers[k] = v
		}
	}
	return p
}

// decoded is a message read back from AMQP, with what the wire said about
// its attempts.
type decoded struct {
	msg         *sdk.Message
	base        int // the attempt header, 1 when absent
	deliveryCnt int // x-delivery-count (quorum queues), -1 when absent
	// extra holds the header values Message cannot carry: non-string
	// values (numbers, booleans, byte arrays, tables, arrays) that a
	// producer outside berth set. Nil when there are none. The copies
	// berth publishes of the message carry them again (see carried).
	extra amqp.Table
}

// decode turns an AMQP message back into a Message. Broker headers are
// left out; non-string header values (which berth never writes) are kept
// aside in extra, except under reserved berth- names, which only berth
// writes, and always as strings.
func decode(h amqp.Table, id, typ, corr string, body []byte) decoded {
	m := &sdk.Message{ID: id, Type: typ, CorrelationID: corr, Body: body}
	d := decoded{msg: m, base: 1, deliveryCnt: -1}
	for k, v := range h {
		switch k {
		case headerIdempotencyKey:
			m.IdempotencyKey, _ = v.(string)
		case headerKey:
			m.Key, _ = v.(string)
		case sdk.HeaderAttempt:
			if n, ok := toInt(v); ok && n > 0 {
				d.base = min(n, maxAttempt)
			}
		case "x-delivery-count":
			if n, ok := toInt(v); ok {
				d.deliveryCnt = n
			}
		default:
			if brokerHeaders[k] {
				continue
			}
			if s, ok := v.(string); ok {
				m.SetHeader(k, s)
			} else if !strings.HasPrefix(k, "berth-") {
				if d.extra == nil {
					d.extra = amqp.Table{}
				}
				d.extra[k] = v
			}
		}
	}
	return d
}

// frameOverhead is what a frame adds to its payload: type, channel and size
// (7 bytes) and the frame-end octet.
const frameOverhead = 8

// deadLetterRoom is the room Publish leaves in the content header frame for
// what berth adds to a message's copies: the dead-letter annotations (a
// reason of up to sdk.MaxReasonLength bytes, class, attempts, queue, first
// and last failure), the attempt and redrive count headers.
const deadLetterRoom = 2048

// contentHeaderSize is the size, at most, of the payload of p's content
// header frame: its properties and headers, which AMQP carries in one frame
// that cannot be split. A frame over the connection's frame_max is a
// connection error (501 FRAME_ERROR): the server closes the whole
// connection, failing every publish, settlement copy and declaration on it.
func contentHeaderSize(p amqp.Publishing) int {
	n := 2 + 2 + 8 + 2 + 1 + 1 + 8 // class, weight, body size, flags, delivery mode, priority, timestamp
	for _, s := range [...]string{p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo,
		p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if len(p.Headers) > 0 {
		n += fieldSize(p.Headers) - 1 // a table property has no type octet
	}
	return n
}

// fieldSize is the encoded size, at most, of an AMQP field value with its
// type octet, as amqp091 writes it.
func fieldSize(v any) int {
	switch v := v.(type) {
	case nil:
		return 1
	case string:
		return 5 + len(v)
	case []byte:
		return 5 + len(v)
	case []any:
		n := 5
		for _, e := range v {
			n += fieldSize(e)
		}
		return n
	case amqp.Table:
		n := 5
		for k, e := range v {
			n += 1 + len(k) + fieldSize(e)
		}
		return n
	}
	return 9 // a number, boolean, decimal or timestamp: 9 bytes at most
}

// messageHeaderSize is contentHeaderSize of m as encode writes it (with an
// attempt header of any value), without building the publishing.
func messageHeaderSize(m *sdk.Message) int {
	n := 2 + 2 + 8 + 2 + 1 + 8 + 4 // class, weight, body size, flags, delivery mode, timestamp, table length
	for _, s := range [...]string{m.ID, m.Type, m.CorrelationID} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	for k, v := range m.Headers {
		n += 1 + len(k) + 5 + len(v)
	}
	if m.IdempotencyKey != "" {
		n += 1 + len(headerIdempotencyKey) + 5 + len(m.IdempotencyKey)
	}
	if m.Key != "" {
		n += 1 + len(headerKey) + 5 + len(m.Key)
	}
	return n + 1 + len(sdk.HeaderAttempt) + 5 + 10
}

// maxAttempt bounds Attempt(): the attempt header can be set to any number
// by a producer outside berth, and Attempt()+1 (a Retry's copy) or the
// attempt header plus x-delivery-count must not wrap round to a negative
// attempt, or to one that encode leaves out (the attempts starting again at
// 1). An attempt this high is dead-lettered by any retry policy.
const maxAttempt = 1 << 30

func toInt(v any) (int, bool) {
	switch n := v.(type) {
	case string:
		i, err := strconv.Atoi(n)
		return i, err == nil
	case int:
		return n, true
	case int8:
		return int(n), true
	case int16:
		return int(n), true
	case int32:
		return int(n), true
	case int64:
		return int(n), true
	case uint8:
		return int(n), true
	case uint16:
		return int(n), true
	case uint32:
		return int(n), true
	}
	return 0, false
}

// deathInfo reads the x-death header RabbitMQ adds when it dead-letters a
// message itself: the queue it left and why, and when.
func deathInfo(h amqp.Table) (queue, reason string, at time.Time, ok bool) {
	deaths, _ := h["x-death"].([]any)
	if len(deaths) == 0 {
		return "", "", time.Time{}, false
	}
	first, _ := deaths[0].(amqp.Table) // most recent death first
	if first == nil {
		return "", "", time.Time{}, false
	}
	queue, _ = first["queue"].(string)
	reason, _ = first["reason"].(string)
	at, _ = first["time"].(time.Time)
	return queue, reason, at, true
}

// annotateBrokerDeath gives a message the broker dead-lettered on its own
// (delivery limit, rejection) the same reason headers as berth's DeadLetter.
//
// Such a message never went through berth's DeadLetter, so any berth-dlq-*
// header it carries came from its publisher: they are dropped and replaced.
// (A copy berth dead-letters is published to the dead-letter exchange and
// has no x-death.)
func annotateBrokerDeath(m *sdk.Message, h amqp.Table, mainQueue string) {
	q, reason, at, ok := deathInfo(h)
	if !ok {
		return
	}
	for _, k := range []string{sdk.HeaderDeadLetterReason, sdk.HeaderDeadLetterClass,
		sdk.HeaderDeadLetterAttempts, sdk.HeaderDeadLetterQueue, sdk.HeaderLastFailure} {
		delete(m.Headers, k)
	}
	if q == "" || strings.Contains(q, ".delay.") {
		q = mainQueue
	}
	var cause error = sdk.ErrMaxDeliveries
	if reason != "delivery_limit" {
		cause = fmt.Errorf("rabbitmq: dead-lettered by the broker: %s", sdk.ErrorText(reason))
	}
	if at.IsZero() {
		at = time.Now()
	}
	// The attempt it died at is not known: the x-delivery-count of a dead
	// letter is the dead-letter queue's own count of its deliveries (0 on
	// its first, 1 after a walk's channel died), not the main queue's, which
	// the server does not keep when it dead-letters. So no attempts header.
	sdk.AnnotateDeadLetter(m, q, 0, cause, at, at)
	delete(m.Headers, sdk.HeaderDeadLetterAttempts)
}

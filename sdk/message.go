package sdk

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Message is one job. Publishers fill ID and CorrelationID when they are empty
// (see [Prepare]); every other field is carried unchanged to the consumer.
type Message struct {
	// ID is unique per publish. Filled with a UUIDv7 if empty.
	ID string
	// Type is the job type, e.g. "billing.charge": it routes the job ([Router])
	// and labels its metrics.
	Type string
	// IdempotencyKey names the business operation, e.g. "charge:order_123:v1".
	// It is not the message ID: two publishes of the same operation share it.
	IdempotencyKey string
	// Key is the ordering key (the SQS FIFO MessageGroupId). Optional.
	Key string
	// CorrelationID ties together the jobs of one business flow. Filled from the
	// publishing context (see [WithCorrelationID]), else with the message's
	// own ID: a message published outside any flow starts one.
	CorrelationID string
	// Headers are application headers. Names starting with "berth-" (in any
	// case) are reserved for brokers: [Prepare] refuses them (see
	// [IsReservedHeader]).
	Headers map[string]string
	// Body is the payload; any bytes, including none.
	Body []byte
	// Delay postpones the first delivery. Optional.
	Delay time.Duration
}

// Clone returns a deep copy of m.
func (m *Message) Clone() *Message {
	c := *m
	if m.Headers != nil {
		c.Headers = make(map[string]string, len(m.Headers))
		for k, v := range m.Headers {
			c.Headers[k] = v
		}
	}
	if m.Body != nil {
		c.Body = append([]byte(nil), m.Body...)
	}
	return &c
}

// Size is the number of bytes the message occupies on a broker: body, header
// names and values, and the string fields. Brokers compare it with their limit.
func (m *Message) Size() int {
	n := len(m.Body) + len(m.ID) + len(m.Type) + len(m.IdempotencyKey) + len(m.Key) + len(m.CorrelationID)
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n
}

// Header returns the value of header name, or "" when absent.
func (m *Message) Header(name string) string {
	if m.Headers == nil {
		return ""
	}
	return m.Headers[name]
}

// SetHeader sets header name to value, allocating the map if needed.
func (m *Message) SetHeader(name, value string) {
	if m.Headers == nil {
		m.Headers = make(map[string]string)
	}
	m.Headers[name] = value
}

// Reserved header names. Brokers write them on dead-lettered and retried
// messages; applications read them, never set them.
const (
	// HeaderDeadLetterReason is the error text that dead-lettered the message.
	HeaderDeadLetterReason = "berth-dlq-reason"
	// HeaderDeadLetterClass is the [ErrorClass] of that error.
	HeaderDeadLetterClass = "berth-dlq-class"
	// HeaderDeadLetterAttempts is the attempt at which the message was dead-lettered.
	HeaderDeadLetterAttempts = "berth-dlq-attempts"
	// HeaderDeadLetterQueue is the queue the message was dead-lettered from,
	// where redrive puts it back.
	HeaderDeadLetterQueue = "berth-dlq-queue"
	// HeaderFirstFailure is the RFC 3339 time of the first failure the broker
	// knows of (brokers that cannot track retries set it to the last failure).
	HeaderFirstFailure = "berth-first-failure"
	// HeaderLastFailure is the RFC 3339 time of the failure that dead-lettered it.
	HeaderLastFailure = "berth-last-failure"
	// HeaderRedriveCount counts how many times the message was redriven.
	HeaderRedriveCount = "berth-redrive-count"
	// HeaderAttempt carries the attempt number on brokers that republish
	// retries as new messages (RabbitMQ).
	HeaderAttempt = "berth-attempt"
	// HeaderDeadLetterTruncated marks a dead letter whose annotations the
	// broker shortened so that it fits the broker's size limit
	// ([FitDeadLetter]): "reason" when [HeaderDeadLetterReason] was cut (or
	// left out), "all" when every dead-letter annotation was left out. The
	// message itself (ID, fields, headers, body) is stored as it was. A
	// redrive ([PrepareRedrive]) and a new annotation ([AnnotateDeadLetter])
	// remove it.
	HeaderDeadLetterTruncated = "berth-dlq-truncated"
)

// MaxDelay bounds delays given to Publish and Retry on every broker, so that
// portable code behaves alike (SQS cannot delay longer than 15 minutes at
// publish; Retry through visibility allows 12 hours).
const MaxDelay = 12 * time.Hour

// ValidateQueueName reports whether name is a portable queue name: 1 to 80
// characters of letters, digits, '_', '-' and '.', not starting with '.' or
// '-'. Brokers may add rules of their own. The error wraps [ErrInvalidQueue].
func ValidateQueueName(name string) error {
	if len(name) == 0 || len(name) > 80 || name[0] == '.' || name[0] == '-' {
		return &QueueNameError{Name: name}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return &QueueNameError{Name: name}
		}
	}
	return nil
}

// ReservedHeaderPrefix starts every header name berth reserves for itself
// (compared without regard to case).
const ReservedHeaderPrefix = "berth-"

// IsReservedHeader reports whether name starts with [ReservedHeaderPrefix],
// in any case. Only brokers write such headers (dead-letter annotation,
// redrive, attempts); [Prepare] refuses them from applications, and a broker
// never takes a routing decision (a redrive target) from one.
func IsReservedHeader(name string) bool {
	return len(name) >= len(ReservedHeaderPrefix) && strings.EqualFold(name[:len(ReservedHeaderPrefix)], ReservedHeaderPrefix)
}

// ValidateHeaders checks that header names are non-empty valid UTF-8 and values
// valid UTF-8. The error wraps [ErrInvalidHeader].
func ValidateHeaders(h map[string]string) error {
	for k, v := range h {
		if k == "" || !utf8.ValidString(k) {
			return &HeaderError{Name: k, Reason: "name must be non-empty UTF-8"}
		}
		if !utf8.ValidString(v) {
			return &HeaderError{Name: k, Reason: "value must be UTF-8"}
		}
	}
	return nil
}

// NewID returns a new message ID: a UUIDv7 (RFC 9562), time-ordered and
// monotonic within the process: 48 bits of Unix milliseconds, 12 bits of
// sub-millisecond time bumped when two IDs would tie (as
// github.com/google/uuid's NewV7 does), and 62 random bits from a
// cryptographically strong generator seeded from crypto/rand.
func NewID() string { return uuid.UUID(ids.next()).String() }

// ids generates the message IDs. One mutex guards both the clock sequence
// and the random generator: the uuid package's NewV7FromReader took two
// locks, and an allocation for the array its reader interface made escape.
var ids idGen

type idGen struct {
	mu   sync.Mutex
	last int64 // the last milliseconds<<12 | sequence handed out
	// rng gives each ID its random bits: math/rand/v2's ChaCha8, which its
	// documentation calls cryptographically strong, seeded once from
	// crypto/rand. crypto/rand itself (the getrandom vDSO) cost 27 ns an ID
	// on this project's VMs, a quarter of PrepareAll; ChaCha8 costs a few.
	rng *mrand.ChaCha8
}

func (g *idGen) next() [16]byte {
	var us [1][16]byte
	g.fill(us[:], time.Now().UnixNano())
	return us[0]
}

// fill writes into us IDs for the Unix time nano, under one lock: each one
// is for nano, or just after the one before it when that is later, so the
// IDs of a batch share one clock read and increase in order.
func (g *idGen) fill(us [][16]byte, nano int64) {
	milli := nano / int64(time.Millisecond)
	t := milli<<12 | (nano-milli*int64(time.Millisecond))>>8 // the sub-millisecond part fits 12 bits
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rng == nil {
		var seed [32]byte
		_, _ = rand.Read(seed[:]) // crypto/rand.Read never fails (it crashes the program instead)
		g.rng = mrand.NewChaCha8(seed)
	}
	for i := range us {
		if t <= g.last {
			t = g.last + 1
		}
		g.last = t
		u := &us[i]
		binary.BigEndian.PutUint64(u[8:], g.rng.Uint64())
		milli, seq := t>>12, t&0xfff
		for j := range 6 {
			u[j] = byte(milli >> (40 - 8*j))
		}
		u[6] = 0x70 | byte(seq>>8) // version 7
		u[7] = byte(seq)
		u[8] = u[8]&0x3f | 0x80 // variant RFC 9562
	}
}

// idChunk is the most IDs [PrepareAll] makes at once, into one string. An
// ID keeps its chunk's string alive: at most idChunk*36 bytes.
const idChunk = 16

// idBatch hands out the IDs of one PrepareAll call. They are made when the
// first is needed, for as many of the messages left as lack one (up to
// idChunk): one lock, one clock read and one allocation for all of them,
// instead of one allocation an ID.
type idBatch struct {
	rest []*Message // the messages after the one being prepared
	ids  string     // IDs made and not yet handed out, 36 bytes each
	nano int64      // the batch's clock read
}

func (b *idBatch) next() string {
	if b.ids == "" {
		n := 1
		for _, m := range b.rest {
			if n == idChunk {
				break
			}
			if m != nil && m.ID == "" {
				n++
			}
		}
		if b.nano == 0 {
			b.nano = time.Now().UnixNano()
		}
		var raw [idChunk][16]byte
		ids.fill(raw[:n], b.nano)
		var sb strings.Builder
		sb.Grow(36 * n)
		var text [36]byte
		for i := range n {
			uuidText(&text, &raw[i])
			sb.Write(text[:])
		}
		b.ids = sb.String()
	}
	id := b.ids[:36]
	b.ids = b.ids[36:]
	return id
}

// uuidText writes u in the canonical 8-4-4-4-12 form (uuid.UUID.String's).
// It turns four bytes at a time into eight digits in one 64-bit word
// (hex8): a loop over the 32 digits cost 50-60 ns an ID on this project's
// VMs, a fifth of PrepareAll; this costs about 17.
func uuidText(dst *[36]byte, u *[16]byte) {
	a := hex8(binary.BigEndian.Uint32(u[0:4]))
	b := hex8(binary.BigEndian.Uint32(u[4:8]))
	c := hex8(binary.BigEndian.Uint32(u[8:12]))
	d := hex8(binary.BigEndian.Uint32(u[12:16]))
	binary.BigEndian.PutUint64(dst[0:8], a)
	dst[8] = '-'
	binary.BigEndian.PutUint32(dst[9:13], uint32(b>>32))
	dst[13] = '-'
	binary.BigEndian.PutUint32(dst[14:18], uint32(b))
	dst[18] = '-'
	binary.BigEndian.PutUint32(dst[19:23], uint32(c>>32))
	dst[23] = '-'
	binary.BigEndian.PutUint32(dst[24:28], uint32(c))
	binary.BigEndian.PutUint64(dst[28:36], d)
}

// hex8 returns the eight lower-case hex digits of x, most significant
// first, as the bytes of a big-endian uint64: it spreads the nibbles one a
// byte, then adds '0' to each, and 'a'-'0'-10 more to those above 9 (a
// nibble n > 9 is exactly one where n+6 carries into bit 4).
func hex8(x uint32) uint64 {
	v := uint64(x)
	v = (v | v<<16) & 0x0000ffff0000ffff
	v = (v | v<<8) & 0x00ff00ff00ff00ff
	v = (v | v<<4) & 0x0f0f0f0f0f0f0f0f
	letters := ((v + 0x0606060606060606) >> 4) & 0x0101010101010101
	return v + 0x3030303030303030 + letters*('a'-'0'-10)
}

// Prepare is what every broker's Publish calls before anything is sent: it
// validates the queue name, the headers, the delay and the size against limit
// (limit <= 0 means no limit), and fills ID and CorrelationID when empty. It
// modifies m in place. Its errors are typed ([QueueNameError], [HeaderError],
// [MessageTooLargeError], [ErrInvalidMessage]) and nothing is published when
// any message of a batch fails it.
//
// It refuses, with an error wrapping [ErrInvalidMessage]: a reserved header
// name ([IsReservedHeader]; the error also wraps a [HeaderError]) other than
// [HeaderDueAt] holding an RFC 3339 time and, beside such a HeaderDueAt,
// a non-empty [HeaderHopOf] (what [LongDelay] writes), and an ID,
// Type, Key, IdempotencyKey or CorrelationID that is not valid UTF-8 (the
// error names the field). The Body may be any bytes. A CorrelationID taken
// from ctx (the caller left it empty) that is not valid UTF-8 is not
// refused but replaced by "sha256:" and 32 hex digits of its hash: a
// handler does not choose the correlation ID of the delivery it runs for.
func Prepare(ctx context.Context, queue string, m *Message, limit int) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	var b idBatch
	return prepare(ctx, m, limit, &b)
}

// prepare is Prepare without the queue check. b makes the IDs of the batch
// m is in, with one clock read for the whole batch (a read per ID cost a
// tenth of the memory broker's whole publish on VMs with a slow clock
// source) and one allocation for up to idChunk IDs.
func prepare(ctx context.Context, m *Message, limit int, b *idBatch) error {
	if m == nil {
		return fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if m.Delay < 0 || m.Delay > MaxDelay {
		return fmt.Errorf("%w: delay %s outside [0, %s]", ErrInvalidMessage, m.Delay, MaxDelay)
	}
	if err := ValidateHeaders(m.Headers); err != nil {
		return err
	}
	for k, v := range m.Headers {
		if IsReservedHeader(k) && !acceptedReserved(m, k, v) {
			// Both sentinels hold: the message is refused because of a header.
			return fmt.Errorf("%w: %w", ErrInvalidMessage,
				&HeaderError{Name: k, Reason: "names starting with " + ReservedHeaderPrefix + " are reserved for brokers"})
		}
	}
	for _, f := range [...]struct{ name, value string }{
		{"ID", m.ID}, {"Type", m.Type}, {"Key", m.Key}, {"IdempotencyKey", m.IdempotencyKey}, {"CorrelationID", m.CorrelationID},
	} {
		if !utf8.ValidString(f.value) {
			// Brokers carry these as text: PostgreSQL refuses invalid UTF-8
			// and SQS replaces it, mapping distinct keys onto one.
			return fmt.Errorf("%w: %s %q is not valid UTF-8", ErrInvalidMessage, f.name, f.value)
		}
	}
	if m.ID == "" {
		m.ID = b.next()
	}
	if m.CorrelationID == "" {
		m.CorrelationID = CorrelationID(ctx)
		if !utf8.ValidString(m.CorrelationID) {
			m.CorrelationID = textCorrelationID(m.CorrelationID)
		}
		if m.CorrelationID == "" {
			// A message published outside any flow starts one: its own ID
			// names the conversation.
			m.CorrelationID = m.ID
		}
	}
	if limit > 0 && m.Size() > limit {
		return &MessageTooLargeError{ID: m.ID, Size: m.Size(), Limit: limit}
	}
	return nil
}

// acceptedReserved reports whether Prepare accepts the reserved header k
// with value v on m: the ones [LongDelay] writes, when valid.
func acceptedReserved(m *Message, k, v string) bool {
	switch k {
	case HeaderDueAt:
		return validDueAt(v)
	case HeaderHopOf:
		return v != "" && validDueAt(m.Header(HeaderDueAt))
	}
	return false
}

// PrepareAll runs [Prepare] on every message and stops at the first error.
func PrepareAll(ctx context.Context, queue string, msgs []*Message, limit int) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	var b idBatch
	for i, m := range msgs {
		b.rest = msgs[i+1:]
		if err := prepare(ctx, m, limit, &b); err != nil {
			return err
		}
	}
	return nil
}

// textCorrelationID is the correlation ID a follow-up publish carries for
// an inherited one that is not valid UTF-8 (a foreign producer's raw AMQP
// correlation-id): "sha256:" and the first 16 bytes of its SHA-256 in hex.
// Every follow-up of one flow gets the same ID and distinct flows distinct
// ones, in 39 bytes of ASCII whatever the original's length (replacing the
// invalid bytes with U+FFFD would merge binary IDs into one and could grow
// an ID past RabbitMQ's 255 bytes).
func textCorrelationID(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

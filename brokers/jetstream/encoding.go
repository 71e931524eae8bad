package jetstream

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/berthq/berth/internal/jsontext"
	"github.com/berthq/berth/sdk"
)

// headerEnvelope is the NATS header that carries every Message field but the
// body, as JSON (an [envelope]). JSON escapes CR, LF and every control
// character, so any header name or value berth accepts fits in one NATS
// header line, and the message comes back exactly as it was published.
const headerEnvelope = "Berth-Message"

// envelope is the JSON in the Berth-Message header.
type envelope struct {
	V  int    `json:"v"`
	ID string `json:"id"`
	T  string `json:"t,omitempty"`
	IK string `json:"ik,omitempty"`
	K  string `json:"k,omitempty"`
	C  string `json:"c,omitempty"` // absent: the ID

	H map[string]string `json:"h,omitempty"`
	// A is the attempt of the first delivery of this stored copy, when
	// above 1: a released message is published again as a new copy whose
	// deliveries start counting at the released delivery's attempt.
	A int `json:"a,omitempty"`
	// NB is when a delayed copy becomes ready (Unix nanoseconds), 0 when
	// it is ready at once.
	NB int64 `json:"nb,omitempty"`
}

// validate checks what sdk.Prepare does not and JetStream needs: string
// fields in UTF-8 (JSON would replace invalid bytes, changing them).
func validate(m *sdk.Message) error {
	for i, v := range [...]string{m.ID, m.Type, m.IdempotencyKey, m.Key, m.CorrelationID} {
		if !utf8.ValidString(v) {
			name := [...]string{"ID", "Type", "IdempotencyKey", "Key", "CorrelationID"}[i]
			return fmt.Errorf("%w: %s is not valid UTF-8", sdk.ErrInvalidMessage, name)
		}
	}
	return nil
}

// encode returns the NATS message for m on subject. base is the attempt its
// first delivery counts as (1 for a new message); notBefore, when not zero,
// is when a delayed copy becomes ready. extra, nil for a message berth
// publishes, is the NATS headers of the stored message m was decoded from
// that are not berth's or JetStream's (a foreign producer's, see
// [foreignHeaders]): the copy carries them as they are, every value and
// byte, and the envelope only the headers of m that differ from them.
func encode(m *sdk.Message, extra nats.Header, subject string, base int, notBefore time.Time) (*nats.Msg, error) {
	env := envelope{V: 1, ID: m.ID, T: m.Type, IK: m.IdempotencyKey, K: m.Key, C: m.CorrelationID, H: m.Headers}
	if len(extra) > 0 {
		env.H = nil
		for k, v := range m.Headers {
			if vs := extra[k]; len(vs) > 0 && vs[0] == v {
				continue // restored from the NATS header by decode
			}
			if env.H == nil {
				env.H = make(map[string]string, len(m.Headers))
			}
			env.H[k] = v
		}
	}
	if env.C == env.ID {
		// A message outside any flow carries its own ID as correlation
		// ID (sdk.Prepare): left out, decode restores it, and the header
		// the server stores for every message is a third shorter.
		env.C = ""
	}
	if base > 1 {
		env.A = base
	}
	if !notBefore.IsZero() {
		env.NB = notBefore.UnixNano()
	}
	value, ok := appendPlain(make([]byte, 0, 96), &env)
	if !ok {
		raw, err := json.Marshal(env)
		if err != nil { // strings and a map of strings always marshal
			return nil, fmt.Errorf("berth/jetstream: encode message %s: %w", sdk.ErrorText(m.ID), err)
		}
		value = raw
	}
	msg := &nats.Msg{Subject: subject, Header: make(nats.Header, 2+len(extra)), Data: m.Body} // and Nats-Msg-Id
	for k, vs := range extra {
		// Only what m still has: a header deleted from the Message (by a
		// handler before Release, by PrepareRedrive, by DeadLetter) stays
		// deleted on the copy. decode puts every foreign key in m.Headers.
		if _, ok := m.Headers[k]; ok {
			msg.Header[k] = vs
		}
	}
	msg.Header[headerEnvelope] = []string{string(value)}
	return msg, nil
}

// appendPlain appends the JSON of env to dst exactly as json.Marshal writes
// it, without reflection, when that is simple: no headers, and every string
// printable ASCII that JSON writes as it is (no quote or backslash, and none of the
// '<', '>', '&' that json.Marshal escapes). Otherwise it reports false and
// the caller uses json.Marshal. A message ID (a UUID) and a type name
// almost always are plain: this is the path of nearly every publish.
func appendPlain(dst []byte, env *envelope) ([]byte, bool) {
	if len(env.H) > 0 {
		return dst, false
	}
	for _, v := range [...]string{env.ID, env.T, env.IK, env.K, env.C} {
		if !jsontext.Plain(v) {
			return dst, false
		}
	}
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(env.V), 10)
	dst = append(dst, `,"id":"`...)
	dst = append(dst, env.ID...)
	dst = append(dst, '"')
	for _, f := range [...]struct{ key, v string }{{`,"t":"`, env.T}, {`,"ik":"`, env.IK}, {`,"k":"`, env.K}, {`,"c":"`, env.C}} {
		if f.v != "" {
			dst = append(dst, f.key...)
			dst = append(dst, f.v...)
			dst = append(dst, '"')
		}
	}
	if env.A != 0 {
		dst = append(dst, `,"a":`...)
		dst = strconv.AppendInt(dst, int64(env.A), 10)
	}
	if env.NB != 0 {
		dst = append(dst, `,"nb":`...)
		dst = strconv.AppendInt(dst, env.NB, 10)
	}
	return append(dst, '}'), true
}

// wireSize is what the server counts against max_payload, headers and body,
// of msg published with Nats-Msg-Id id (which nats.go adds to its headers).
func wireSize(msg *nats.Msg, id string) int {
	n := len("NATS/1.0\r\n\r\n") + len(msg.Data) + len(nats.MsgIdHdr) + len(": \r\n") + len(id)
	for k, vs := range msg.Header {
		for _, v := range vs {
			n += len(k) + len(": \r\n") + len(v)
		}
	}
	return n
}

// copyReserve is what Publish keeps of the server's max_payload, beyond a
// message's own wire size, so that every copy berth may store of an accepted
// message fits too: its dead letter (at the least with its annotations
// dropped, see [Broker.fitDeadLetter]), a release, a give-back, a move and
// a redrive with its held copy. A copy differs from the published message
// in its Nats-Msg-Id, at most an internalID of the dead-letter stream's
// name (the queue's stream's, two bytes longer) with two numbers (the
// held copy of a redrive), and in its envelope, by at most
// [envelopeGrowth] bytes.
//
// The alternative, refusing nothing at Publish and shortening every copy
// at the time it is stored, cannot keep a message's own fields and headers
// exact: the ID alone of a copy may be longer than the message's. With the
// reserve, DeadLetter has only its own annotations to shorten (see
// fitDeadLetter), and Release and redrive nothing. It costs a message
// within a few hundred bytes of max_payload a typed
// [sdk.MessageTooLargeError] at Publish, instead of a dead letter that can
// never be stored and a delivery that loops for ever.
func copyReserve(stream string) int {
	return len(internalPrefix) + len(idRedriveHold) + 1 + len(stream) + 2 + 2*(1+20) + envelopeGrowth
}

// envelopeGrowth bounds what a copy's envelope adds to the published one's:
// a carried attempt (`,"a":` and 7 digits, maxCarried), a due time
// (`,"nb":` and 19 digits), a berth-redrive-count header with 20 digits and
// a berth-dlq-truncated one (`,"h":{...}` around them): 116 bytes.
const envelopeGrowth = 128

// msgID returns a Nats-Msg-Id for s: s itself when it is printable ASCII
// without spaces (a UUID always is), else "sha256:" and its hex digest. It
// never contains a space, so it never equals an [internalID].
func msgID(s string) string {
	if headerSafe(s) && len(s) <= 128 {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// internalPrefix begins the Nats-Msg-Id of every copy berth stores itself
// (a move, a release, a give-back, a dead letter, a redrive). Its space is
// what keeps the two ID spaces apart: msgID never writes one, so no user
// message ID, whatever it is, makes JetStream drop berth's copy as a
// duplicate of it within the Duplicates window, or the other way round.
const internalPrefix = "berth "

// Kinds of internal IDs. A copy stored as a release (rel), a give-back
// (back) or a move (mv) carries its attempt over (envelope.A); the others
// start at attempt 1.
const (
	idMove       = "mv"
	idRelease    = "rel"
	idGiveBack   = "back"
	idDeadLetter = "dlq"
	idRedrive    = "rd"
	// idRedriveHold is the held copy a redrive stores before it takes
	// the dead letter (see RedriveDeadLetters), with a number of its own
	// per call: two redrives of one letter must not share a held copy
	// (the loser deletes its own, which the winner may depend on).
	idRedriveHold = "rdh"
)

// internalID returns the Nats-Msg-Id of a copy of kind derived from stream
// and nums (sequences, delivery counts): "berth <kind>:<stream>:<n>...".
func internalID(kind, stream string, nums ...uint64) string {
	b := make([]byte, 0, len(internalPrefix)+len(kind)+len(stream)+2+21*len(nums))
	b = append(b, internalPrefix...)
	b = append(b, kind...)
	b = append(b, ':')
	b = append(b, stream...)
	for _, n := range nums {
		b = append(b, ':')
		b = strconv.AppendUint(b, n, 10)
	}
	return string(b)
}

// carriesAttempt reports whether a stored copy with Nats-Msg-Id id was
// stored by berth to carry a delivery's attempt over (Release, a give-back,
// and the move of either from the delayed subject): only then is the
// envelope's A honoured. IDs of berth versions before internalPrefix
// ("rel:...", "back:...", "mv:...") are still recognised, so that copies
// stored before an upgrade keep their count; a berth Publish never writes A,
// so a user's message ID of that form carries nothing over.
func carriesAttempt(id string) bool {
	id = strings.TrimPrefix(id, internalPrefix)
	for _, k := range [...]string{idRelease, idGiveBack, idMove} {
		if len(id) > len(k) && id[len(k)] == ':' && id[:len(k)] == k {
			return true
		}
	}
	return false
}

// maxCarried bounds the attempt a stored copy may carry over (envelope.A),
// whatever its header says; the Broker bounds it again by its poison cap.
const maxCarried = 1 << 20

func headerSafe(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// idToken returns the subject token a dead letter with id is stored under:
// the id when it is a safe token, else "h" and the hex SHA-256 of it.
func idToken(id string) string {
	ok := id != "" && len(id) <= 64
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-'
	}
	if ok {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "h" + hex.EncodeToString(sum[:16])
}

// decoded is a stored message read back.
type decoded struct {
	msg       *sdk.Message
	base      int       // attempt of the copy's first delivery, in [1, maxCarried]
	notBefore time.Time // zero when ready at once
	// ignoredA is set when the envelope had an attempt (A) that decode did
	// not honour: the copy was not stored by berth to carry one over.
	ignoredA bool
	// extra is the message's foreign NATS headers ([foreignHeaders]), nil
	// when there are none; every copy berth stores of it passes them to
	// encode.
	extra nats.Header
}

// foreignHeaders returns the NATS headers of a stored message that are
// neither berth's envelope nor JetStream's own (Nats-*), nil when there are
// none: a foreign producer's headers, which may have several values and
// values that are not UTF-8 (neither fits the envelope's JSON, which would
// keep the first value and replace invalid bytes).
func foreignHeaders(h nats.Header) nats.Header {
	var extra nats.Header
	for k, vs := range h {
		if k == headerEnvelope || strings.HasPrefix(k, "Nats-") || len(vs) == 0 {
			continue
		}
		if extra == nil {
			extra = make(nats.Header, len(h))
		}
		extra[k] = vs
	}
	return extra
}

// decode restores the message encode wrote. A message without the
// Berth-Message header (from another producer) gets its Nats-Msg-Id (else,
// or when that is not UTF-8, "<stream>:<seq>:<stored>") as ID, its data as body, and its headers (first
// values; JetStream's own Nats-* headers left out) as headers. Those NATS
// headers are also the decoded's extra, which every copy of the message
// carries (see [encode]); a copy's envelope headers take precedence over
// them.
//
// The envelope's attempt (A) is honoured only for a copy whose Nats-Msg-Id
// says berth stored it to carry an attempt over ([carriesAttempt]), and is
// bounded to [1, maxCarried]: any producer can write a Berth-Message
// header, and must not set the attempt a delivery reports.
func decode(h nats.Header, data []byte, stream string, seq uint64, stored time.Time) (decoded, error) {
	raw := h.Get(headerEnvelope)
	if raw == "" {
		id := h.Get(nats.MsgIdHdr)
		if id == "" || !utf8.ValidString(id) {
			// Not UTF-8, an ID would change in the envelope of every copy
			// (JSON replaces the bytes): its dead letter, stored under
			// the ID's token, could not be found by the ID it shows.
			id = seqID(stream, seq, stored)
		}
		return asForeign(h, data, id), nil
	}
	var env envelope
	if err := json.Unmarshal([]byte(raw), &env); err != nil {
		return decoded{}, fmt.Errorf("berth/jetstream: %s:%d: undecodable %s header: %w", stream, seq, headerEnvelope, err)
	}
	m := &sdk.Message{ID: env.ID, Type: env.T, IdempotencyKey: env.IK, Key: env.K, CorrelationID: env.C, Headers: env.H}
	extra := foreignHeaders(h)
	if extra != nil {
		m.Headers = make(map[string]string, len(extra)+len(env.H))
		for k, vs := range extra {
			m.Headers[k] = vs[0]
		}
		for k, v := range env.H {
			m.Headers[k] = v
		}
	}
	if m.CorrelationID == "" {
		m.CorrelationID = m.ID // left out by encode when it was the ID
	}
	if len(data) > 0 {
		m.Body = data
	}
	d := decoded{msg: m, base: 1, extra: extra}
	if env.A > 1 {
		if carriesAttempt(h.Get(nats.MsgIdHdr)) {
			d.base = min(env.A, maxCarried)
		} else {
			d.ignoredA = true
		}
	}
	if env.NB > 0 {
		d.notBefore = time.Unix(0, env.NB)
	}
	return d, nil
}

// asForeign is the message of a stored NATS message taken as a foreign
// producer's: ID id, its data as body, its foreign headers (first values)
// as headers and as the decoded's extra.
func asForeign(h nats.Header, data []byte, id string) decoded {
	m := &sdk.Message{ID: id, Body: data}
	extra := foreignHeaders(h)
	for k, vs := range extra {
		m.SetHeader(k, vs[0])
	}
	return decoded{msg: m, base: 1, extra: extra}
}

// seqID is the ID of a stored message that has none berth can use:
// "<stream>:<seq>:<stored>", stored being when the stream stored it (Unix
// nanoseconds). A stream deleted and created again numbers its messages
// from 1 again: the time keeps the ID of a message stored after that from
// naming one stored before (whose effects an idempotency key derived from
// the ID may have recorded, or whose dead letter an operator looked at).
func seqID(stream string, seq uint64, stored time.Time) string {
	return stream + ":" + strconv.FormatUint(seq, 10) + ":" + storedStamp(stored)
}

// storedStamp is when a stream stored a message, in Unix nanoseconds.
func storedStamp(stored time.Time) string {
	return strconv.FormatInt(stored.UnixNano(), 10)
}

package sqs

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/internal/jsontext"
	"github.com/berthq/berth/sdk"
)

// attrName is the one message attribute berth writes: a JSON [envelope].
const attrName = "berth"

// attrType is its SQS data type.
const attrType = "String"

// Body encodings, in envelope.Enc.
const (
	encText   = ""      // the SQS body is the message body
	encBase64 = "b64"   // the SQS body is the standard base64 of the message body
	encEmpty  = "empty" // the message body is empty; the SQS body is a placeholder
)

// emptyBody is what an empty message body is sent as (SQS refuses empty bodies).
const emptyBody = "-"

// envelope carries every Message field but the body, in the "berth" attribute.
type envelope struct {
	V   int               `json:"v"`
	ID  string            `json:"id"`
	T   string            `json:"t,omitempty"`
	IK  string            `json:"ik,omitempty"`
	K   string            `json:"k,omitempty"`
	C   string            `json:"c,omitempty"`
	Enc string            `json:"e,omitempty"`
	H   map[string]string `json:"h,omitempty"`
}

// encoded is a message ready for SendMessage(Batch).
type encoded struct {
	body  string
	attrs map[string]sqstypes.MessageAttributeValue
	size  int // as SQS counts it: body, attribute names, types and values
}

// encode turns m into an SQS body and attributes that any SQS server accepts
// and that decode restores exactly.
func encode(m *sdk.Message) (encoded, error) {
	body, bodyEnc := encodeBody(m.Body)
	value, err := encodeAttr(m, bodyEnc)
	if err != nil {
		return encoded{}, err
	}
	return encoded{
		body: body,
		attrs: map[string]sqstypes.MessageAttributeValue{
			attrName: {DataType: aws.String(attrType), StringValue: aws.String(value)},
		},
		size: wireLen(body, value),
	}, nil
}

// encodeBody returns what the SQS body of a message with body b is, and its
// encoding (envelope.Enc).
func encodeBody(b []byte) (body, enc string) {
	switch {
	case len(b) == 0:
		return emptyBody, encEmpty
	case isSQSText(b):
		return string(b), encText
	default:
		return base64.StdEncoding.EncodeToString(b), encBase64
	}
}

// encodeAttr returns the value of the "berth" attribute of m, whose body is
// sent with encoding enc.
func encodeAttr(m *sdk.Message, enc string) (string, error) {
	if v, ok := appendPlainEnvelope(m, enc); ok {
		return v, nil
	}
	env := envelope{V: 1, ID: m.ID, T: m.Type, IK: m.IdempotencyKey, K: m.Key, C: m.CorrelationID, Enc: enc, H: m.Headers}
	raw, err := json.Marshal(env)
	if err != nil { // strings and a map of strings always marshal
		return "", fmt.Errorf("berth/sqs: encode message %s: %w", sdk.ErrorText(m.ID), err)
	}
	return escapeNonSQS(raw), nil
}

// appendPlainEnvelope is the "berth" attribute of m, as json.Marshal of
// its envelope writes it, when that needs no escaping: no headers, and
// every field printable ASCII without '"', '\', '<', '>' or '&' (as a
// berth ID, a type name and most keys are). It reports false otherwise, and
// encodeAttr marshals. json.Marshal's reflection was most of encode's cost,
// a few microseconds a message that a publisher of one message a call pays
// on top of the SDK's.
func appendPlainEnvelope(m *sdk.Message, enc string) (string, bool) {
	if len(m.Headers) > 0 {
		return "", false
	}
	fields := [...]struct {
		name, value string
		always      bool
	}{{`"id":`, m.ID, true}, {`"t":`, m.Type, false}, {`"ik":`, m.IdempotencyKey, false}, {`"k":`, m.Key, false}, {`"c":`, m.CorrelationID, false}, {`"e":`, enc, false}}
	n := len(`{"v":1}`)
	for _, f := range fields {
		if f.value == "" && !f.always {
			continue
		}
		if !jsontext.Plain(f.value) {
			return "", false
		}
		n += 1 + len(f.name) + len(f.value) + 2
	}
	b := make([]byte, 0, n)
	b = append(b, `{"v":1`...)
	for _, f := range fields {
		if f.value == "" && !f.always {
			continue
		}
		b = append(b, ',')
		b = append(b, f.name...)
		b = append(b, '"')
		b = append(b, f.value...)
		b = append(b, '"')
	}
	b = append(b, '}')
	return string(b), true
}

// wireLen is the size SQS counts of a message with body and "berth"
// attribute value: body, attribute name, type and value.
func wireLen(body, value string) int {
	return len(body) + len(attrName) + len(attrType) + len(value)
}

// decode restores the message that encode turned into msg. A message without
// the "berth" attribute (from another producer) is [foreign].
func decode(msg sqstypes.Message) (*sdk.Message, error) {
	body := aws.ToString(msg.Body)
	a, ok := msg.MessageAttributes[attrName]
	if !ok || aws.ToString(a.DataType) != attrType {
		return foreign(msg), nil
	}
	var env envelope
	if err := parseEnvelope(aws.ToString(a.StringValue), &env); err != nil {
		return nil, fmt.Errorf("berth/sqs: message %s: undecodable %q attribute: %w", aws.ToString(msg.MessageId), attrName, err)
	}
	m := &sdk.Message{ID: env.ID, Type: env.T, IdempotencyKey: env.IK, Key: env.K, CorrelationID: env.C, Headers: env.H}
	switch env.Enc {
	case encText:
		m.Body = []byte(body)
	case encEmpty:
		m.Body = nil
	case encBase64:
		b, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			return nil, fmt.Errorf("berth/sqs: message %s: undecodable base64 body: %w", sdk.ErrorText(env.ID), err)
		}
		m.Body = b
	default:
		return nil, fmt.Errorf("berth/sqs: message %s: unknown body encoding %q", sdk.ErrorText(env.ID), env.Enc)
	}
	return m, nil
}

// foreign is the message of an SQS message that berth did not encode: its
// SQS MessageId as ID, its MessageGroupId (FIFO) as Key, so that its dead
// letter and a redrive keep its group, its body as it is, and its String and
// Number attributes as headers, except those with a reserved name (berth-…),
// which only berth writes: a foreign producer's berth-dlq-reason or
// berth-dlq-queue would otherwise pass for berth's own.
func foreign(msg sqstypes.Message) *sdk.Message {
	m := &sdk.Message{ID: aws.ToString(msg.MessageId), Body: []byte(aws.ToString(msg.Body)),
		Key: msg.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)]}
	for name, v := range msg.MessageAttributes {
		if v.StringValue != nil && !sdk.IsReservedHeader(name) {
			m.SetHeader(name, *v.StringValue)
		}
	}
	return m
}

// sqsRune reports whether SQS (and every emulator) accepts r in a body or a
// String attribute: #x9 | #xA | #xD | #x20–#xD7FF | #xE000–#xFFFD. SQS also
// accepts #x10000–#x10FFFF, but fauxqs does not, so berth encodes them.
func sqsRune(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD || (r >= 0x20 && r <= 0xD7FF) || (r >= 0xE000 && r <= 0xFFFD)
}

// hiBits and below20 are isSQSText's word masks: the high bit of every byte,
// and 0x20 in every byte. With no high bit set in w, (w-below20)&^w&hiBits
// is non-zero exactly when some byte of w is below 0x20 (the borrow of a
// byte's subtraction can only set a higher byte's high bit after a lower
// byte went below 0x20 too).
const (
	hiBits  = 0x8080808080808080
	below20 = 0x2020202020202020
)

// isSQSText reports whether b can be sent as an SQS body as it is.
func isSQSText(b []byte) bool {
	for len(b) > 0 {
		// Eight bytes at a time while they are printable ASCII (no high bit,
		// none below 0x20): a body is mostly that, and a byte at a time was
		// 3 ns a byte, a percent or two of an SQS publisher's CPU. A word
		// with anything else goes through the byte loop below.
		for len(b) >= 8 {
			w := binary.LittleEndian.Uint64(b)
			if w&hiBits != 0 || (w-below20)&^w&hiBits != 0 {
				break
			}
			b = b[8:]
		}
		if len(b) == 0 {
			break
		}
		if c := b[0]; c < utf8.RuneSelf { // ASCII, most of a JSON body: no rune decoding
			if c < 0x20 && c != 0x9 && c != 0xA && c != 0xD {
				return false
			}
			b = b[1:]
			continue
		}
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			return false
		}
		if !sqsRune(r) {
			return false
		}
		b = b[n:]
	}
	return true
}

// escapeNonSQS rewrites the runes of JSON text js that SQS refuses as \u
// escapes (surrogate pairs beyond the BMP). Such runes only occur inside JSON
// strings (json.Marshal already escapes control characters), where the escape
// means the same rune, so the result decodes to the same value.
func escapeNonSQS(js []byte) string {
	if isSQSText(js) {
		return string(js)
	}
	var out bytes.Buffer
	out.Grow(len(js) + 16)
	for _, r := range string(js) {
		if sqsRune(r) {
			out.WriteRune(r)
			continue
		}
		if r > 0xFFFF {
			r -= 0x10000
			writeU(&out, 0xD800+(r>>10))
			writeU(&out, 0xDC00+(r&0x3FF))
			continue
		}
		writeU(&out, r)
	}
	return out.String()
}

func writeU(out *bytes.Buffer, r rune) {
	s := strconv.FormatInt(int64(r), 16)
	out.WriteString(`\u`)
	for i := len(s); i < 4; i++ {
		out.WriteByte('0')
	}
	out.WriteString(s)
}

// fifoTokenRE: SQS allows these characters, at most 128, in MessageGroupId
// and MessageDeduplicationId.
func isFIFOToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x21 || c > 0x7E { // alphanumerics and punctuation !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
			return false
		}
	}
	return true
}

// fifoToken returns s when SQS accepts it as a group or deduplication ID,
// else the hex SHA-256 of s (64 characters), which it always accepts.
func fifoToken(s string) string {
	if isFIFOToken(s) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

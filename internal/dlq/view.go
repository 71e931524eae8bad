package dlq

import (
	"encoding/base64"
	"strconv"
	"unicode/utf8"

	"github.com/berthq/berth/sdk"
)

// History is what berth knows of a dead letter's failures, from its
// dead-letter headers.
type History struct {
	Reason       string `json:"reason"`
	Class        string `json:"class"`
	Attempts     int    `json:"attempts"`
	Queue        string `json:"queue,omitempty"`
	FirstFailure string `json:"first_failure,omitempty"`
	LastFailure  string `json:"last_failure,omitempty"`
	RedriveCount int    `json:"redrive_count"`
}

// Message is the JSON form of a dead letter that the berth command and the
// dashboard print: a body that is not UTF-8 is base64 with BodyEncoding
// "base64". An ID that is not UTF-8 (a raw message from another producer:
// an AMQP message-id is bytes) cannot be a JSON string: ID holds it with
// each invalid byte replaced by U+FFFD, for reading, and IDBase64 its exact
// bytes, the ID that redrive and purge need. Fields are only ever added.
type Message struct {
	ID             string            `json:"id"`
	IDBase64       string            `json:"id_base64,omitempty"` // only when ID is not UTF-8
	Type           string            `json:"type"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Key            string            `json:"key,omitempty"`
	CorrelationID  string            `json:"correlation_id,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
	Body           string            `json:"body"`
	BodyEncoding   string            `json:"body_encoding"` // "text" (UTF-8) or "base64"
	DeadLetter     History           `json:"dead_letter"`
}

// View returns the JSON form of m.
func View(m *sdk.Message) Message {
	j := Message{ID: m.ID, Type: m.Type, IdempotencyKey: m.IdempotencyKey, Key: m.Key, CorrelationID: m.CorrelationID,
		Headers: m.Headers, Body: string(m.Body), BodyEncoding: "text", DeadLetter: HistoryOf(m)}
	if !utf8.ValidString(m.ID) {
		j.IDBase64 = base64.StdEncoding.EncodeToString([]byte(m.ID))
	}
	if !utf8.Valid(m.Body) {
		j.Body, j.BodyEncoding = base64.StdEncoding.EncodeToString(m.Body), "base64"
	}
	return j
}

// HistoryOf reads m's dead-letter headers.
func HistoryOf(m *sdk.Message) History {
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	return History{
		Reason: m.Header(sdk.HeaderDeadLetterReason), Class: m.Header(sdk.HeaderDeadLetterClass),
		Attempts: atoi(m.Header(sdk.HeaderDeadLetterAttempts)), Queue: m.Header(sdk.HeaderDeadLetterQueue),
		FirstFailure: m.Header(sdk.HeaderFirstFailure), LastFailure: m.Header(sdk.HeaderLastFailure),
		RedriveCount: sdk.RedriveCount(m), // as a redrive reads it: a forged count is none
	}
}

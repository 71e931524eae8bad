package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/berthq/berth/internal/notfound"
	"github.com/berthq/berth/sdk"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrMissingKey is wrapped (permanently) by the middleware for a message
	// without an idempotency key when [MissingKeyReject] is in force.
	ErrMissingKey = errors.New("idempotency: missing idempotency key")
	// ErrKeyConflict is wrapped (permanently) when a key is reused for a
	// different payload: the stored result belongs to another operation.
	ErrKeyConflict = errors.New("idempotency: key reused with a different payload")
	// ErrInProgress is wrapped in the [sdk.RetryAfter] returned for a
	// duplicate that finds the key claimed by a live worker.
	ErrInProgress = errors.New("idempotency: key in progress elsewhere")
	// ErrClaimLost reports that a lease-mode claim expired and was taken over
	// before it was completed or released: this attempt's result is not
	// stored. It is transient: the redelivery finds the new owner's outcome.
	ErrClaimLost = errors.New("idempotency: claim lost")
	// ErrNotFound is returned by Store.Get for an unknown key. It matches
	// sdk.ErrNotFound too (ARCHITECTURE.md, "Error classes").
	ErrNotFound = notfound.New("idempotency: key not found")
	// ErrInvalidConfig reports options or identifiers a constructor refuses.
	ErrInvalidConfig = errors.New("idempotency: invalid configuration")
	// ErrInvalidKey is wrapped (permanently, see [sdk.Permanent]) by a
	// store's Claim or Begin for a key, job type or fingerprint it cannot
	// hold: pgstore refuses NUL bytes and invalid UTF-8 (PostgreSQL text)
	// and keys too long for its unique index (about 2700 bytes). Every
	// retry would fail the same way.
	ErrInvalidKey = errors.New("idempotency: key the store cannot hold")
)

// MissingKeyError reports a message that carries no idempotency key. It wraps
// [ErrMissingKey].
type MissingKeyError struct {
	MessageID string
	Type      string
}

// Error says which message has no key. The ID comes from the message, so
// it is untrusted: written as it is when Go would print it unescaped, else
// quoted with Go escapes (a newline, a control or bidirectional-text
// character), as the error becomes a dead-letter reason and a log line.
func (e *MissingKeyError) Error() string {
	return fmt.Sprintf("idempotency: message %s (type %q) has no idempotency key", sdk.ErrorText(e.MessageID), e.Type)
}

// Unwrap returns [ErrMissingKey].
func (e *MissingKeyError) Unwrap() error { return ErrMissingKey }

// ConflictError reports a key reused for a different payload. It wraps
// [ErrKeyConflict].
type ConflictError struct {
	Key     string
	JobType string // job type of the message that conflicted
	Stored  string // job type stored with the key

	hashed bool // Error names Key by its digest ([Options.LogKeys] unset)
}

// Error names the key and both job types. A Guard's ConflictError names the
// key by its [KeyDigest] unless [Options.LogKeys] is set: the text becomes a
// dead-letter reason, which travels further than the store.
func (e *ConflictError) Error() string {
	key := fmt.Sprintf("key %q", e.Key)
	if e.hashed {
		key = "key_sha256 " + KeyDigest(e.Key)
	}
	return fmt.Sprintf("idempotency: %s reused with a different payload (job type %q, stored for %q)", key, e.JobType, e.Stored)
}

// Unwrap returns [ErrKeyConflict].
func (e *ConflictError) Unwrap() error { return ErrKeyConflict }

// MissingKey says what the middleware does with a message that has no key.
type MissingKey int

const (
	// MissingKeyReject dead-letters it with a [MissingKeyError]. The default:
	// a message ID changes with every publish, so it dedupes redeliveries but
	// not a job published twice.
	MissingKeyReject MissingKey = iota
	// MissingKeyUseMessageID uses the message ID as the key.
	MissingKeyUseMessageID
)

// KeyFunc extracts the idempotency key of a message; "" means none.
type KeyFunc func(m *sdk.Message) string

// MessageKey is the default [KeyFunc]: Message.IdempotencyKey.
func MessageKey(m *sdk.Message) string { return m.IdempotencyKey }

// FingerprintFunc returns a digest of what a message asks to do. Two messages
// with the same key and different fingerprints conflict.
type FingerprintFunc func(m *sdk.Message) string

// Fingerprint is the default [FingerprintFunc]: [FingerprintOf] the job
// type and the body. Headers, IDs and correlation IDs are not part of it:
// they differ between two publishes of one operation.
func Fingerprint(m *sdk.Message) string {
	return FingerprintOf(m.Type, m.Body)
}

// FingerprintOf is the fingerprint of a job type and a payload: the hex
// SHA-256 of the job type, a zero byte and the body. Two different (type,
// body) pairs never share a fingerprint (short of a SHA-256 collision): a
// job type holding a zero byte itself, which that input would not delimit
// ("a\x00b" with "c" and "a" with "b\x00c"), is hashed in another form
// instead — a domain tag, the type in hex, and the SHA-256 of the body —
// which holds no zero byte, so it is no input of the first form. Fingerprints
// are stored with their keys (pgstore's fingerprint column, memstore, the
// redisstore cache), so those of every other job type are what they always
// were; pgstore refuses job types with a zero byte anyway ([ErrInvalidKey]).
func FingerprintOf(jobType string, body []byte) string {
	h := sha256.New()
	if strings.IndexByte(jobType, 0) >= 0 {
		sum := sha256.Sum256(body)
		h.Write([]byte("berth-fingerprint-nul-type:"))
		h.Write([]byte(hex.EncodeToString([]byte(jobType))))
		h.Write([]byte{':'})
		h.Write([]byte(hex.EncodeToString(sum[:])))
		return hex.EncodeToString(h.Sum(nil))
	}
	h.Write([]byte(jobType))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

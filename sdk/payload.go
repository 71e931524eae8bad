package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// DecodeError reports a body that does not decode into the handler's type. It
// wraps [ErrUndecodable] and the decoder's error.
type DecodeError struct {
	MessageID string
	Type      string
	Err       error
}

// Error names the message, its type and the decoder's complaint.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("berth: message %s (type %q): undecodable body: %v", ErrorText(e.MessageID), e.Type, e.Err)
}

// Unwrap returns [ErrUndecodable] and the decoder's error.
func (e *DecodeError) Unwrap() []error { return []error{ErrUndecodable, e.Err} }

// Decode decodes the JSON body of m into a T. A failure is permanent (a
// [PermanentError] wrapping a [DecodeError]): no retry makes bad bytes good.
// A body that is the JSON literal null is such a failure too, whatever T: it
// carries no payload, and would decode to a nil pointer or a zero value.
//
// Fields the body has and T lacks are ignored, so a producer that adds a
// field does not send every job of consumers not yet upgraded to the
// dead-letter queue; use [DecodeStrict] to refuse them.
func Decode[T any](m *Message) (T, error) { return decode[T](m, false) }

// DecodeStrict is [Decode] refusing fields that T lacks: for payloads whose
// every field matters and whose producers deploy with their consumers.
func DecodeStrict[T any](m *Message) (T, error) { return decode[T](m, true) }

// null is the JSON literal that Decode and NewJSON refuse as a whole body.
var null = []byte("null")

func decode[T any](m *Message, strict bool) (T, error) {
	var v T
	if bytes.Equal(bytes.TrimSpace(m.Body), null) {
		return v, Permanent(&DecodeError{MessageID: m.ID, Type: m.Type, Err: errors.New("body is JSON null")})
	}
	dec := json.NewDecoder(bytes.NewReader(m.Body))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(&v); err != nil {
		return v, Permanent(&DecodeError{MessageID: m.ID, Type: m.Type, Err: err})
	}
	// Only the end of the body may follow (More reports false before a
	// stray '}' or ']', which must be refused too).
	if _, err := dec.Token(); err != io.EOF {
		return v, Permanent(&DecodeError{MessageID: m.ID, Type: m.Type, Err: fmt.Errorf("trailing data after JSON value")})
	}
	return v, nil
}

// JSON returns a Handler that decodes each delivery's body into a T and calls
// fn with it. Undecodable bodies are dead-lettered without calling fn.
func JSON[T any](fn func(ctx context.Context, d Delivery, v T) error) Handler {
	return HandlerFunc(func(ctx context.Context, d Delivery) error {
		v, err := Decode[T](d.Message())
		if err != nil {
			return err
		}
		return fn(ctx, d, v)
	})
}

// NewJSON returns a message of type jobType whose body is v encoded as JSON.
// A v that encodes to null (nil, a nil pointer) is refused with
// [ErrInvalidMessage]: [Decode] would refuse the body.
func NewJSON(jobType string, v any) (*Message, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: encode %s payload: %v", ErrInvalidMessage, jobType, err)
	}
	if bytes.Equal(b, null) {
		return nil, fmt.Errorf("%w: %s payload %T encodes to null", ErrInvalidMessage, jobType, v)
	}
	return &Message{Type: jobType, Body: b}, nil
}

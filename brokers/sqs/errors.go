package sqs

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/berthq/berth/sdk"
)

const fifoSuffix = ".fifo"

// sqsNameChars reports whether s is a non-empty run of SQS's queue name
// alphabet (without the ".fifo" suffix): letters, digits, '-' and '_'. A
// loop rather than a regular expression: Publish checks the name on every
// call, and the regexp cost about a microsecond.
func sqsNameChars(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// validateQueueName checks the portable rules ([sdk.ValidateQueueName]) and
// SQS's: letters, digits, '-' and '_', at most 80 characters, and a '.' only
// in a ".fifo" suffix.
func validateQueueName(name string) error {
	if err := sdk.ValidateQueueName(name); err != nil {
		return err
	}
	base := strings.TrimSuffix(name, fifoSuffix)
	if !sqsNameChars(base) {
		return &sdk.QueueNameError{Name: name, Reason: "SQS allows letters, digits, '-' and '_', and '.' only in a \".fifo\" suffix"}
	}
	return nil
}

// ErrLeaseCeiling is wrapped by [LeaseCeilingError].
var ErrLeaseCeiling = errors.New("berth/sqs: visibility beyond SQS's 12-hour ceiling")

// LeaseCeilingError reports an ExtendLease (or another lease extension) that
// would keep a message invisible more than 12 hours after it was received,
// which SQS refuses; Retry clamps its delay to the ceiling instead.
// Nothing was changed: the lease ends when it would have. It wraps
// [ErrLeaseCeiling].
type LeaseCeilingError struct {
	ID        string        // message ID
	Requested time.Duration // the lease or delay asked for, from now
	Received  time.Time     // when the message was received
}

func (e *LeaseCeilingError) Error() string {
	return fmt.Sprintf("berth/sqs: message %s: %s more would end %s after its receipt, beyond SQS's ceiling of %s",
		sdk.ErrorText(e.ID), e.Requested, time.Since(e.Received).Round(time.Second)+e.Requested, MaxVisibility)
}

// Unwrap returns [ErrLeaseCeiling].
func (e *LeaseCeilingError) Unwrap() error { return ErrLeaseCeiling }

// DelayError reports a publish delay SQS cannot honour: over 15 minutes, or
// any per-message delay on a FIFO queue. Nothing of the batch was published.
// It wraps [sdk.ErrInvalidMessage].
type DelayError struct {
	ID    string
	Delay time.Duration
	Max   time.Duration // 15 minutes; 0 on a FIFO queue
}

func (e *DelayError) Error() string {
	if e.Max == 0 {
		return fmt.Sprintf("berth/sqs: message %s: FIFO queues take no per-message delay (%s asked)", sdk.ErrorText(e.ID), e.Delay)
	}
	return fmt.Sprintf("berth/sqs: message %s: delay %s over SQS's maximum of %s", sdk.ErrorText(e.ID), e.Delay, e.Max)
}

// Unwrap returns [sdk.ErrInvalidMessage].
func (e *DelayError) Unwrap() error { return sdk.ErrInvalidMessage }

// AckError reports a delete (Ack, or the delete that follows a DeadLetter)
// that SQS refused. Flush returns it; the message comes back after its
// visibility timeout.
type AckError struct {
	Queue string
	ID    string // berth message ID
	Err   error
}

func (e *AckError) Error() string {
	return fmt.Sprintf("berth/sqs: delete of message %s from %s failed: %v", sdk.ErrorText(e.ID), e.Queue, e.Err)
}

// Unwrap returns the cause.
func (e *AckError) Unwrap() error { return e.Err }

// apiCode returns the SQS error code of err, or "".
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// isTransport reports whether err is a failure to reach SQS at all.
func isTransport(err error) bool {
	var send *smithyhttp.RequestSendError
	var nerr net.Error
	return errors.As(err, &send) || errors.As(err, &nerr)
}

// answerCut reports whether err is SQS's success answer (a 2xx status)
// that could not be read: the body cut short or garbled. SQS did what was
// asked (took the messages); only its answer is lost.
func answerCut(err error) bool {
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() >= 200 && re.HTTPStatusCode() < 300
}

// viaGateway reports whether err is a 502 (bad gateway) or 504 (gateway
// timeout) answer. SQS itself answers neither (its own failures are 500 and
// 503): something between the client and SQS did — a proxy, a load
// balancer, a VPC endpoint — after it may have passed the request on. Like
// a lost answer, it says nothing of what SQS did.
func viaGateway(err error) bool {
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) {
		return false
	}
	code := re.HTTPStatusCode()
	return code == http.StatusBadGateway || code == http.StatusGatewayTimeout
}

// isStaleReceipt reports whether err says the receipt handle no longer
// holds the message: its visibility ran out and it was received again, or
// it was deleted.
func isStaleReceipt(err error) bool {
	var notInflight *sqstypes.MessageNotInflight
	var invalid *sqstypes.ReceiptHandleIsInvalid
	if errors.As(err, &notInflight) || errors.As(err, &invalid) {
		return true
	}
	return staleCode(apiCode(err))
}

// staleCode reports whether an SQS error code (of a call or of a batch
// entry) says that a receipt handle no longer holds its message.
func staleCode(code string) bool {
	switch code {
	case "MessageNotInflight", "ReceiptHandleIsInvalid", "InvalidParameterValue",
		"AWS.SimpleQueueService.MessageNotInflight":
		return true
	}
	return false
}

// leaseLost wraps err for a delivery whose receipt handle went stale.
func leaseLost(id string, err error) error {
	if err == nil {
		return fmt.Errorf("berth/sqs: message %s: %w", sdk.ErrorText(id), sdk.ErrLeaseLost)
	}
	return fmt.Errorf("berth/sqs: message %s: %w: %w", sdk.ErrorText(id), sdk.ErrLeaseLost, err)
}

// joinErrorText returns ids, message IDs, each as [sdk.ErrorText] writes it,
// joined with ", ".
func joinErrorText(ids []string) string {
	quoted := make([]string, len(ids))
	for i, id := range ids {
		quoted[i] = sdk.ErrorText(id)
	}
	return strings.Join(quoted, ", ")
}

package sqs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// TestLostAttemptClassifies: the one definition of an attempt whose answer
// was lost, for each kind of error that reaches watchAttempts' place in the
// stack (past signing, inside the retry loop). A transport failure comes as
// a ResponseError around smithy's stand-in response of status 0: it counts
// by that status, not by having no response, so a rule keyed on 2xx alone
// (answerCut's) would stop counting it.
func TestLostAttemptClassifies(t *testing.T) {
	status := func(code int, cause error) error {
		return &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: code}},
			Err:      cause,
		}
	}
	refused := &smithyhttp.RequestSendError{Err: errors.New("connect: connection refused")}
	for _, c := range []struct {
		name string
		err  error
		lost bool
	}{
		{"transport failure, stand-in status 0", status(0, refused), true},
		{"context ended, stand-in status 0", status(0, context.DeadlineExceeded), true},
		{"transport failure, no response", refused, true},
		{"context cancelled, no response", fmt.Errorf("attempt: %w", context.Canceled), true},
		{"2xx answer unreadable", status(200, errors.New("unexpected EOF")), true},
		{"gateway 502", status(http.StatusBadGateway, errors.New("bad gateway")), true},
		{"gateway 504", status(http.StatusGatewayTimeout, errors.New("gateway timeout")), true},
		{"SQS's 500", status(http.StatusInternalServerError, errors.New("InternalError")), false},
		{"SQS's 400", status(http.StatusBadRequest, errors.New("InvalidParameterValue")), false},
		{"a failure before the request left", errors.New("failed to compute payload sha256"), false},
	} {
		if got := lostAttempt(c.err); got != c.lost {
			t.Errorf("%s: lostAttempt = %v, want %v", c.name, got, c.lost)
		}
	}
}

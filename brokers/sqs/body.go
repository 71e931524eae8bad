package sqs

import (
	"context"
	"io"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// A request's answer could be lost to a race in the client itself: a
// ReceiveMessage that the SDK retried, the messages its first attempt took
// hidden for the visibility timeout ("a receive attempt's answer was lost";
// a round of 5000 messages on the emulator stalled 10 s, one in four or so),
// and a SendMessageBatch sent twice.
//
// net/http writes a request's body, then reads it once more to check that
// it ended where ContentLength said, with io.Copy, which uses the body's
// WriteTo when it has one. smithy-go hands net/http the body in a wrapper
// that returns io.EOF once closed, from Read and from WriteTo, and closes
// it as soon as the answer's headers arrive. On loopback the answer can
// arrive before that last check: WriteTo then returns io.EOF, which io.Copy
// takes for an error (a WriteTo returns nil at the end), the write fails,
// net/http closes the connection, and reading the answer's body fails with
// "use of closed network connection" — after SQS acted, the status 200
// already read. (Upstream, aws-sdk-go-v2 made that error retryable, which
// is what turns it into a second attempt.)
//
// SafeRequestBody returns a call option that hides the request body's
// WriteTo from net/http: its last check then reads through Read, which
// returns io.EOF, the end of the body, and the request succeeds. The Broker
// adds it to every call it makes; add it to calls of your own whose answer
// matters (a ReceiveMessage, a SendMessageBatch to a standard queue):
//
//	out, err := client.ReceiveMessage(ctx, in, sqs.SafeRequestBody())
func SafeRequestBody() func(*awssqs.Options) { return withBody }

// withBody is [SafeRequestBody]'s option.
var withBody = awssqs.WithAPIOptions(func(s *middleware.Stack) error {
	return s.Finalize.Add(middleware.FinalizeMiddlewareFunc("berthBodyWithoutWriteTo",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if req, ok := in.Request.(*smithyhttp.Request); ok {
				if body, ok := req.GetStream().(readSeekWriterTo); ok {
					r, err := req.SetStream(readSeeker{body})
					if err != nil {
						return middleware.FinalizeOutput{}, middleware.Metadata{}, err
					}
					in.Request = r
				}
			}
			return next.HandleFinalize(ctx, in)
		}), middleware.After) // after signing, once an attempt
})

// readSeekWriterTo is a request body that net/http would read with WriteTo.
type readSeekWriterTo interface {
	io.ReadSeeker
	io.WriterTo
}

// readSeeker is a request body without its WriteTo (see withBody). It keeps
// Seek: the SDK rewinds the body for each attempt.
type readSeeker struct{ rs io.ReadSeeker }

func (r readSeeker) Read(p []byte) (int, error)                   { return r.rs.Read(p) }
func (r readSeeker) Seek(offset int64, whence int) (int64, error) { return r.rs.Seek(offset, whence) }

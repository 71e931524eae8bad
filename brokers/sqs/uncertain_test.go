package sqs_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/internal/syncbuf"
	"github.com/berthq/berth/sdk"
)

// batchServer is a fake SQS whose SendMessageBatch calls send answers: a
// refusal of the whole call (500 InternalError), or the entries accepted
// and the connection dropped before the answer (a lost answer: the client
// gets a transport error, sdk.ErrUnavailable, for messages SQS took), or
// the entries accepted and the 200 answer cut short. It records the bodies
// it took. The emulator does neither on demand.
type batchServer struct {
	mu    sync.Mutex
	calls int
	took  map[string]bool // message bodies accepted
}

// The answers batchServer's script picks from.
const (
	refuseBatch    = iota // 500 InternalError: nothing of the call taken
	dropAnswer            // every entry taken, the connection dropped
	acceptBatch           // every entry taken and answered
	cutAnswer             // every entry taken, the 200 answer cut short
	omitEntries           // every entry taken, a 200 answer naming none of them
	gatewayTimeout        // every entry taken, then a load balancer's 504 page
	failEntries           // nothing taken, a 200 answer naming every entry as failed on SQS's side
)

// newBatchServer returns a client of a batchServer; script picks the answer
// to the n-th SendMessageBatch call (from 1) of the given bodies, and may
// block first.
func newBatchServer(t *testing.T, script func(n int, bodies []string) int) (*awssqs.Client, *batchServer) {
	t.Helper()
	s := &batchServer{took: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		switch op {
		case "GetQueueUrl":
			_, _ = io.WriteString(w, `{"QueueUrl":"http://fake/000000000000/q"}`)
			return
		case "SendMessageBatch":
		default:
			_, _ = io.WriteString(w, `{}`)
			return
		}
		var req struct {
			Entries []struct{ Id, MessageBody string }
		}
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("SendMessageBatch request: %v", err)
		}
		bodies := make([]string, len(req.Entries))
		for i, e := range req.Entries {
			bodies[i] = e.MessageBody
		}
		s.mu.Lock()
		s.calls++
		n := s.calls
		s.mu.Unlock()
		answer := script(n, bodies)
		switch answer {
		case refuseBatch:
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"__type":"com.amazonaws.sqs#InternalError","message":"try again"}`)
			return
		case dropAnswer:
			s.take(bodies)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			_ = conn.Close()
			return
		case gatewayTimeout:
			s.take(bodies)
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusGatewayTimeout)
			_, _ = io.WriteString(w, "<html><body><h1>504 Gateway Time-out</h1></body></html>")
			return
		case cutAnswer:
			s.take(bodies)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\nContent-Length: 500\r\n\r\n"+`{"Successful":[{"Id":"0"`)
			_ = conn.Close()
			return
		}
		if answer == failEntries {
			failed := make([]string, len(req.Entries))
			for i, e := range req.Entries {
				failed[i] = fmt.Sprintf(`{"Id":%q,"Code":"InternalError","Message":"try again","SenderFault":false}`, e.Id)
			}
			_, _ = fmt.Fprintf(w, `{"Successful":[],"Failed":[%s]}`, strings.Join(failed, ","))
			return
		}
		s.take(bodies)
		if answer == omitEntries {
			_, _ = io.WriteString(w, `{"Successful":[],"Failed":[]}`)
			return
		}
		ok := make([]string, len(req.Entries))
		for i, e := range req.Entries {
			ok[i] = fmt.Sprintf(`{"Id":%q,"MessageId":"m%s","MD5OfMessageBody":"x"}`, e.Id, e.Id)
		}
		_, _ = fmt.Fprintf(w, `{"Successful":[%s],"Failed":[]}`, strings.Join(ok, ","))
	}))
	return fakeClient(t, srv), s
}

func (s *batchServer) take(bodies []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range bodies {
		s.took[b] = true
	}
}

// taken reports which of msgs the server took.
func (s *batchServer) taken(msgs []*sdk.Message) (in, out []*sdk.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		if s.took[string(m.Body)] {
			in = append(in, m)
		} else {
			out = append(out, m)
		}
	}
	return in, out
}

// bodied returns k messages with the bodies prefix-0, prefix-1, ...
func bodied(prefix string, k int) []*sdk.Message {
	out := make([]*sdk.Message, k)
	for i := range out {
		out[i] = &sdk.Message{Type: "t", Body: []byte(fmt.Sprintf("%s-%d", prefix, i))}
	}
	return out
}

// checkUncertainOutcome fails t unless err, a Publish's of msgs, says that
// the messages the server took may have been published: an error that is
// sdk.ErrUnavailable, or a PublishError naming each of them with one.
// Either way no message may be reported as published, since the answer of
// the call that carried them was lost.
func checkUncertainOutcome(t *testing.T, err error, srv *batchServer, msgs []*sdk.Message) {
	t.Helper()
	in, _ := srv.taken(msgs)
	if len(in) == 0 {
		t.Fatal("the server took none of the messages: the scenario did not happen")
	}
	var pe *sdk.PublishError
	switch {
	case err == nil:
		t.Fatalf("Publish returned nil, yet a call's answer was lost and another call failed")
	case errors.As(err, &pe):
		for _, m := range msgs {
			if pe.Failed[m.ID] == nil {
				t.Errorf("message %s reported published, yet both calls failed: %v", m.Body, err)
			}
		}
		for _, m := range in {
			if !errors.Is(pe.Failed[m.ID], sdk.ErrUnavailable) {
				t.Errorf("message %s, which SQS took before the answer was lost, failed with %v, want sdk.ErrUnavailable (perhaps published)", m.Body, pe.Failed[m.ID])
			}
		}
	case !errors.Is(err, sdk.ErrUnavailable):
		t.Fatalf("Publish: %v; want sdk.ErrUnavailable or a PublishError saying so: %d of its messages were taken by SQS, and this error says that none was published", err, len(in))
	}
}

// TestMultiChunkPublishDoesNotHideALostAnswer: a Publish of two chunks
// whose first call SQS refuses (500) and whose second call's answer is lost
// after SQS took its message returned the first call's error alone, as if
// nothing was published (a caller, or the AsyncPool, then sends every
// message again, one by one). It now returns the error that says the
// messages may have been published.
func TestMultiChunkPublishDoesNotHideALostAnswer(t *testing.T) {
	client, srv := newBatchServer(t, func(n int, bodies []string) int {
		if len(bodies) == 10 {
			return refuseBatch
		}
		return dropAnswer
	})
	b, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	msgs := bodied("multi", 11) // chunks of 10 and 1, sent at once
	err = b.Publish(testCtx(t), "q", msgs...)
	checkUncertainOutcome(t, err, srv, msgs)
}

// TestSharedPublishDoesNotHideALostAnswer: the same through the coalescer.
// PublishSenders 1: a first Publish holds the one sender; X queues 9
// messages and W 2, so the next call carries X's 9 and W's first (SQS
// refuses it, 500) and a later call W's second (taken, the answer lost).
// W returned the first call's error alone.
func TestSharedPublishDoesNotHideALostAnswer(t *testing.T) {
	sharedUncertain(t, dropAnswer)
}

// sharedUncertain runs TestSharedPublishDoesNotHideALostAnswer's scenario
// with answer (one that leaves the entries perhaps published) to the call
// of W's second message.
func sharedUncertain(t *testing.T, answer int) {
	t.Helper()
	release := make(chan struct{})
	arrived := make(chan struct{})
	client, srv := newBatchServer(t, func(n int, bodies []string) int {
		switch {
		case n == 1:
			close(arrived)
			<-release
			return acceptBatch
		case len(bodies) == 10:
			return refuseBatch
		}
		return answer
	})
	b, err := sqs.New(client, sqs.Options{PublishSenders: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := testCtx(t)
	first := make(chan error, 1)
	go func() { first <- b.Publish(ctx, "q", bodied("first", 1)...) }()
	<-arrived
	xs, ws := bodied("x", 9), bodied("w", 2)
	xerr := make(chan error, 1)
	go func() { xerr <- b.Publish(ctx, "q", xs...) }()
	waitQueued(t, b, 9)
	werr := make(chan error, 1)
	go func() { werr <- b.Publish(ctx, "q", ws...) }()
	waitQueued(t, b, 11)
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first Publish: %v", err)
	}
	if err := <-xerr; err == nil || errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("X's Publish (its call refused): %v, want the refusal", err)
	}
	checkUncertainOutcome(t, <-werr, srv, ws)
}

// retrying returns client with the SDK's standard retryer making up to n
// attempts a call, without waiting between them.
func retrying(client *awssqs.Client, n int) *awssqs.Client {
	return awssqs.New(client.Options(), func(o *awssqs.Options) {
		o.RetryMaxAttempts = n
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = n
			so.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		})
	})
}

// TestRetriedPublishDoesNotHideALostAnswer: the SDK retries a call whose
// answer was lost (SQS took its messages) and SQS refuses the retries
// (500). The call's error is the last attempt's refusal, which said that
// nothing was published: a caller or the AsyncPool then sent the messages
// again. It now says that they may have been (sdk.ErrUnavailable). A call
// whose every attempt SQS refused still returns the refusal.
func TestRetriedPublishDoesNotHideALostAnswer(t *testing.T) {
	t.Run("lost then refused", func(t *testing.T) { publishThenRefused(t, dropAnswer, "retried") })
	t.Run("refused every time", func(t *testing.T) {
		client, srv := newBatchServer(t, func(int, []string) int { return refuseBatch })
		b, err := sqs.New(retrying(client, 3), sqs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		err = b.Publish(testCtx(t), "q", bodied("refused", 2)...)
		if n := srv.callCount(); n != 3 {
			t.Fatalf("%d SendMessageBatch calls, want 3 (the SDK's retries)", n)
		}
		if err == nil || errors.Is(err, sdk.ErrUnavailable) {
			t.Fatalf("Publish: %v, want SQS's refusal (nothing was published)", err)
		}
	})
}

// publishThenRefused publishes two messages (bodies prefix-0, prefix-1)
// through a client that tries three times, to a server that answers the
// first attempt with first (after taking the messages) and refuses the
// two retries; the Publish's error must say the messages may have been
// published.
func publishThenRefused(t *testing.T, first int, prefix string) {
	t.Helper()
	client, srv := newBatchServer(t, func(n int, _ []string) int {
		if n == 1 {
			return first
		}
		return refuseBatch
	})
	b, err := sqs.New(retrying(client, 3), sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	msgs := bodied(prefix, 2)
	err = b.Publish(testCtx(t), "q", msgs...)
	if n := srv.callCount(); n != 3 {
		t.Fatalf("%d SendMessageBatch calls, want 3 (the SDK's retries)", n)
	}
	checkUncertainOutcome(t, err, srv, msgs)
}

// TestCutAnswerIsUnavailable: SQS took the messages and its 200 answer was
// cut short. The deserialization error was returned as is, which said that
// nothing was published; it now wraps sdk.ErrUnavailable.
func TestCutAnswerIsUnavailable(t *testing.T) {
	client, srv := newBatchServer(t, func(int, []string) int { return cutAnswer })
	b, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	msgs := bodied("cut", 2)
	err = b.Publish(testCtx(t), "q", msgs...)
	checkUncertainOutcome(t, err, srv, msgs)
}

// TestUnaccountedEntryIsUncertain: SQS answered a call without naming an
// entry among the successful or the failed ones (SQS took it, here). Its
// error did not say that it may have been published, and a shared Publish
// whose other entry SQS refused (500) returned that refusal alone, as if
// nothing was published. The entry is now named with sdk.ErrUnavailable.
func TestUnaccountedEntryIsUncertain(t *testing.T) {
	t.Run("alone", func(t *testing.T) {
		client, srv := newBatchServer(t, func(int, []string) int { return omitEntries })
		b, err := sqs.New(client, sqs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		msgs := bodied("omitted", 2)
		err = b.Publish(testCtx(t), "q", msgs...)
		checkUncertainOutcome(t, err, srv, msgs)
	})
	t.Run("shared with a refused call", func(t *testing.T) {
		sharedUncertain(t, omitEntries)
	})
}

// callCount is how many SendMessageBatch calls the server took.
func (s *batchServer) callCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// TestChecksumMismatchIsUncertain: SQS took the messages and answered 200,
// and the SDK's MD5 check of that answer failed (the answer's checksums do
// not match the bodies sent: a garbled answer, or bodies SQS stored
// otherwise). The check runs outside the SDK's retry loop, after the
// answer: its error was returned as is, which said that nothing was
// published (the AsyncPool then sent each message again). It now wraps
// sdk.ErrUnavailable.
func TestChecksumMismatchIsUncertain(t *testing.T) {
	client, srv := newBatchServer(t, func(int, []string) int { return acceptBatch }) // MD5OfMessageBody "x"
	client = awssqs.New(client.Options(), func(o *awssqs.Options) { o.DisableMessageChecksumValidation = false })
	b, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	msgs := bodied("md5", 2)
	err = b.Publish(testCtx(t), "q", msgs...)
	if err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("Publish: %v, want the SDK's checksum error: the scenario did not happen", err)
	}
	checkUncertainOutcome(t, err, srv, msgs)
}

// TestGatewayAnswerIsUncertain: a proxy or load balancer between the client
// and SQS passed a SendMessageBatch on, SQS took the messages, and the
// proxy answered 504 Gateway Timeout. That answer was taken for SQS's
// refusal, saying that nothing was published; SQS never answers 502 or 504,
// so it now wraps sdk.ErrUnavailable, alone and when the SDK's retries are
// refused after it.
func TestGatewayAnswerIsUncertain(t *testing.T) {
	t.Run("alone", func(t *testing.T) {
		client, srv := newBatchServer(t, func(int, []string) int { return gatewayTimeout })
		b, err := sqs.New(client, sqs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		msgs := bodied("gateway", 2)
		err = b.Publish(testCtx(t), "q", msgs...)
		checkUncertainOutcome(t, err, srv, msgs)
	})
	t.Run("then refused", func(t *testing.T) { publishThenRefused(t, gatewayTimeout, "gateway-retried") })
}

// TestReceiveChecksumMismatchIsLost: SQS answered a ReceiveMessage with
// messages, which it now keeps hidden for the visibility timeout, and the
// SDK's MD5 check of the bodies, made after its retries, failed. Receive
// returned that as a plain error, as if nothing had been taken, and logged
// nothing of the messages that would come back late, an attempt further
// on. It now wraps sdk.ErrUnavailable and warns as for a lost answer.
func TestReceiveChecksumMismatchIsLost(t *testing.T) {
	client := newFakeSQS(t, func(op string, _ int, _ map[string]any) string {
		if op == "ReceiveMessage" {
			return `{"Messages":[{"MessageId":"m0","ReceiptHandle":"h0","Body":"a","MD5OfBody":"00000000000000000000000000000000","Attributes":{"ApproximateReceiveCount":"1"}}]}`
		}
		if s, ok := fakeCommon(op); ok {
			return s
		}
		return `{}`
	})
	client = awssqs.New(client.Options(), func(o *awssqs.Options) { o.DisableMessageChecksumValidation = false })
	var logs syncbuf.Buffer
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ds, err := b.Receive(testCtx(t), "q", 10)
	if err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("Receive = %d deliveries, %v; want the SDK's checksum error: the scenario did not happen", len(ds), err)
	}
	if !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("Receive: %v, want sdk.ErrUnavailable: SQS took the messages", err)
	}
	if !strings.Contains(logs.String(), "answer was lost") || !strings.Contains(logs.String(), "visibility") {
		t.Errorf("no warning that the messages come back after the visibility timeout; log:\n%s", logs.String())
	}
}

// TestReceiveRefusedAfterALostAnswerIsLost: a ReceiveMessage attempt was
// answered 504 by a gateway after SQS took the messages, and SQS refused
// the SDK's retries (500). The call's error was the last refusal, which says
// SQS took nothing: Receive returned it plain and logged nothing of the
// messages that come back only after the visibility timeout. It now wraps
// sdk.ErrUnavailable and warns as for a lost answer.
func TestReceiveRefusedAfterALostAnswerIsLost(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
		if op != "ReceiveMessage" {
			s, _ := fakeCommon(op)
			_, _ = io.WriteString(w, s)
			return
		}
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusGatewayTimeout)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"__type":"com.amazonaws.sqs#InternalError","message":"internal failure"}`)
	}))
	var logs syncbuf.Buffer
	b, err := sqs.New(retrying(fakeClient(t, srv), 3), sqs.Options{WaitTime: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = b.Receive(testCtx(t), "q", 10)
	if n := calls.Load(); n != 3 || err == nil {
		t.Fatalf("%d ReceiveMessage calls, Receive = %v; want 3 calls (the SDK's retries) and an error: the scenario did not happen", n, err)
	}
	if !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("Receive: %v, want sdk.ErrUnavailable: the first attempt may have taken the messages", err)
	}
	if !strings.Contains(logs.String(), "answer was lost") || !strings.Contains(logs.String(), "visibility") {
		t.Errorf("no warning that the messages come back after the visibility timeout; log:\n%s", logs.String())
	}
}

package sqs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
	"go.uber.org/goleak"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/integration"
)

// transport is shared by every test client, so that TestMain can close its
// idle connections (and their goroutines) before goleak looks.
var transport = &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}

func TestMain(m *testing.M) {
	if os.Getenv(helperRole) == "consumer" { // re-executed by TestCrashedConsumer
		helperProcess()
	}
	code := m.Run()
	transport.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// newClient returns an SQS client for the test endpoint, with extra API
// options (call counters).
func newClient(t testing.TB, apiOptions ...func(*middleware.Stack) error) *awssqs.Client {
	t.Helper()
	endpoint := integration.SQSEndpoint(t)
	return awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:   &http.Client{Transport: transport},
		APIOptions:   apiOptions,
	})
}

// newBroker returns a broker on a new client, closed with the test.
func newBroker(t testing.TB, opts sqs.Options, apiOptions ...func(*middleware.Stack) error) *sqs.Broker {
	t.Helper()
	b, err := sqs.New(newClient(t, apiOptions...), opts)
	if err != nil {
		t.Fatalf("sqs.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// suffix returns 12 random hex characters.
func suffix() string {
	var p [6]byte
	_, _ = rand.Read(p[:])
	return hex.EncodeToString(p[:])
}

// declare creates a unique queue (prefix + random, ".fifo" when fifo) with
// its dead-letter queue through b, and deletes both when the test ends,
// after closing b.
func declare(t testing.TB, b *sqs.Broker, prefix string, fifo bool, cfg sqs.QueueConfig) string {
	t.Helper()
	name := prefix + "_" + suffix()
	if fifo {
		name += ".fifo"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.EnsureQueue(ctx, name, cfg); err != nil {
		t.Fatalf("EnsureQueue(%s): %v", name, err)
	}
	t.Cleanup(func() {
		_ = b.Close() // sends the buffered deletes while the queue still exists
		deleteQueue(t, name)
	})
	return name
}

// deleteQueue deletes queue and its dead-letter queue with a broker of its
// own (the test's may be closed by then).
func deleteQueue(t testing.TB, name string) {
	b, err := sqs.New(newClient(t), sqs.Options{})
	if err != nil {
		t.Errorf("sqs.New: %v", err)
		return
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.DeleteQueue(ctx, name, true); err != nil {
		t.Errorf("DeleteQueue(%s): %v", name, err)
	}
}

// opStep is where in the SDK's middleware stack an onOperationAt hook runs.
type opStep int

const (
	// callStart is the start of the Initialize step: once per operation
	// call, before the SDK's own initialize middleware (input validation)
	// and outside its retry loop.
	callStart opStep = iota
	// callValidated is the end of the Initialize step: once per operation
	// call that got past the SDK's initialize middleware, outside its retry
	// loop.
	callValidated
	// eachAttempt is the end of the Finalize step: inside the retry loop,
	// after signing, so once per HTTP attempt, retries included.
	eachAttempt
)

// opHooks numbers onOperationAt's middleware, whose IDs must differ on
// one stack.
var opHooks atomic.Int64

// onOperation is an APIOptions entry that runs fn at the start of every
// call of the SQS operation name ("SendMessageBatch", "GetQueueUrl",
// "ReceiveMessage"...; "" for every operation): once per call, before
// the SDK validates its input and before any retry (callStart). A non-nil
// error from fn ends the call with that error, unsent; nil lets it go on.
// fn runs on the goroutine making the call, as any middleware of it: it
// may count, block (giving up when ctx ends), panic or exit the goroutine.
func onOperation(name string, fn func(ctx context.Context) error) func(*middleware.Stack) error {
	return onOperationAt(callStart, name, fn)
}

// onOperationAt is onOperation with fn run at step of the stack instead:
// eachAttempt runs it once per HTTP attempt, retries included.
func onOperationAt(step opStep, name string, fn func(ctx context.Context) error) func(*middleware.Stack) error {
	id := "berthOnOperation" + strconv.FormatInt(opHooks.Add(1), 10)
	hook := func(ctx context.Context) error {
		if name != "" && awsmiddleware.GetOperationName(ctx) != name {
			return nil
		}
		return fn(ctx)
	}
	return func(st *middleware.Stack) error {
		if step == eachAttempt {
			return st.Finalize.Add(middleware.FinalizeMiddlewareFunc(id,
				func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
					if err := hook(ctx); err != nil {
						return middleware.FinalizeOutput{}, middleware.Metadata{}, err
					}
					return next.HandleFinalize(ctx, in)
				}), middleware.After)
		}
		pos := middleware.Before
		if step == callValidated {
			pos = middleware.After
		}
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc(id,
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if err := hook(ctx); err != nil {
					return middleware.InitializeOutput{}, middleware.Metadata{}, err
				}
				return next.HandleInitialize(ctx, in)
			}), pos)
	}
}

// calls counts SQS API operations by name, through the SDK's middleware
// stack: one per operation call, whatever its HTTP retries.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func newCalls() *calls { return &calls{n: map[string]int{}} }

// option is the APIOptions entry that counts into c: operations by name,
// and HTTP attempts (retries included) under "attempts".
func (c *calls) option(st *middleware.Stack) error {
	if err := onOperationAt(eachAttempt, "", func(context.Context) error {
		c.add("attempts")
		return nil
	})(st); err != nil {
		return err
	}
	return onOperationAt(callValidated, "", func(ctx context.Context) error {
		c.add(awsmiddleware.GetOperationName(ctx))
		return nil
	})(st)
}

// add counts one under key.
func (c *calls) add(key string) {
	c.mu.Lock()
	c.n[key]++
	c.mu.Unlock()
}

// get returns the count of operation op.
func (c *calls) get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

// reset zeroes every count.
func (c *calls) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = map[string]int{}
}

// total is the number of operations counted.
func (c *calls) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for op, k := range c.n {
		if op != "attempts" {
			n += k
		}
	}
	return n
}

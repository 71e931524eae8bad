package sqs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"sync"
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
	err := st.Finalize.Add(middleware.FinalizeMiddlewareFunc("berthCountAttempts",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			c.mu.Lock()
			c.n["attempts"]++
			c.mu.Unlock()
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
	if err != nil {
		return err
	}
	return st.Initialize.Add(middleware.InitializeMiddlewareFunc("berthCountCalls",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			c.mu.Lock()
			c.n[awsmiddleware.GetOperationName(ctx)]++
			c.mu.Unlock()
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
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

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// The SQS scenario runs against the fauxqs emulator (.ci/start-sqs) on
// loopback, or BERTH_SQS_ENDPOINT. Every variant has a client of its own
// (its own connection pool), configured alike.

const (
	sqsSenders = 8  // raw concurrent SendMessageBatch loops; berth's senders
	sqsLoops   = 4  // raw concurrent receive loops; the Worker's ReceiveLoops
	sqsWorkers = 32 // the Worker's Concurrency (Prefetch defaults to it)
	sqsWait    = 1  // long-poll seconds, both sides
	// sqsVisibility is the visibility timeout (seconds) of both sides: short,
	// because fauxqs now and then takes a message off a queue without
	// returning it (raw loops and the Worker alike), and a round then waits
	// for it to come back.
	sqsVisibility = 10
	// sqsRoundsX multiplies the configured rounds for the SQS tables: a
	// round's rate swings by ±15 % on the emulator, on both sides alike,
	// and with the usual six rounds a variant's total rate moved by as much
	// from one run to the next (0.92–1.01× raw for one configuration in
	// three runs). Three times the rounds cut that spread by √3, for
	// about a minute more.
	sqsRoundsX = 3
)

func sqsEndpoint() string {
	if u := os.Getenv("BERTH_SQS_ENDPOINT"); u != "" {
		return u
	}
	return "http://127.0.0.1:4566"
}

// sqsClient returns a client for the emulator with a connection pool of its
// own, large enough for every concurrent call of a variant.
func sqsClient() *awssqs.Client { return sqsClientNamed("") }

// sqsClientNamed is sqsClient whose calls, with BERTH_BENCH_SQSSTATS set,
// are counted by action under name (printed to stderr at the end).
func sqsClientNamed(name string) *awssqs.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 128, IdleConnTimeout: 30 * time.Second}
	var rt http.RoundTripper = tr
	if name != "" && os.Getenv("BERTH_BENCH_SQSSTATS") != "" {
		rt = &sqsCounting{name: name, next: rt}
		// New connections too: a call cancelled mid-answer (a long poll
		// cut short) closes its connection, which costs both sides a
		// handshake that a pool reused would not.
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			countSQS(name + " (new connection)")
			return d.DialContext(ctx, network, addr)
		}
	}
	return awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(sqsEndpoint()),
		Credentials:  credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:   &http.Client{Transport: rt},
	})
}

// sqsCalls counts requests by client name and action (X-Amz-Target).
var sqsCalls sync.Map // string -> *atomic.Int64

// sqsCounting is a RoundTripper that counts what goes through it.
type sqsCounting struct {
	name string
	next http.RoundTripper
}

func (c *sqsCounting) RoundTrip(r *http.Request) (*http.Response, error) {
	countSQS(c.name + " " + r.Header.Get("X-Amz-Target"))
	return c.next.RoundTrip(r)
}

// countSQS adds one to the count under k.
func countSQS(k string) {
	v, _ := sqsCalls.LoadOrStore(k, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// printSQSCalls writes the counted calls to stderr, sorted.
func printSQSCalls() {
	var lines []string
	sqsCalls.Range(func(k, v any) bool {
		lines = append(lines, fmt.Sprintf("sqs calls: %s %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Fprintln(os.Stderr, l)
	}
}

// sqsEnv holds the brokers and queues of one table, deleted by close.
type sqsEnv struct {
	brokers []*sqs.Broker
	queues  []string
	admin   *sqs.Broker
}

func newSQSEnv() (*sqsEnv, error) {
	admin, err := sqs.New(sqsClient(), sqs.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	return &sqsEnv{admin: admin}, nil
}

// broker returns a berth broker on a client of its own.
func (e *sqsEnv) broker(opts sqs.Options) (*sqs.Broker, error) { return e.brokerNamed("", opts) }

// brokerNamed is broker with its calls counted under name (see sqsClientNamed).
func (e *sqsEnv) brokerNamed(name string, opts sqs.Options) (*sqs.Broker, error) {
	opts.Logger = slog.New(slog.DiscardHandler)
	if opts.VisibilityTimeout == 0 {
		opts.VisibilityTimeout = sqsVisibility * time.Second
	}
	if opts.WaitTime == 0 {
		opts.WaitTime = sqsWait * time.Second
	}
	b, err := sqs.New(sqsClientNamed(name), opts)
	if err != nil {
		return nil, err
	}
	e.brokers = append(e.brokers, b)
	return b, nil
}

// queue declares a queue (berth's: with its dead-letter queue) and returns
// its name and URL.
func (e *sqsEnv) queue(ctx context.Context, name string) (string, string, error) {
	q := fmt.Sprintf("berthbench_%s_%d", name, time.Now().UnixNano()%1e9)
	if err := e.admin.DeclareQueue(ctx, q); err != nil {
		return "", "", err
	}
	e.queues = append(e.queues, q)
	out, err := e.admin.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(q)})
	if err != nil {
		return "", "", err
	}
	return q, aws.ToString(out.QueueUrl), nil
}

func (e *sqsEnv) close() {
	for _, b := range e.brokers {
		_ = b.Close()
	}
	ctx := context.Background()
	for _, q := range e.queues {
		_ = e.admin.DeleteQueue(ctx, q, true)
	}
	_ = e.admin.Close()
}

func runSQS(ctx context.Context, c config) ([]table, error) {
	pub, err := sqsPublish(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	con, err := sqsConsume(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	printSQSCalls()
	return []table{pub, con}, nil
}

// rawSQSSend sends n messages from sqsSenders goroutines, each looping
// SendMessageBatch of 10 entries carrying body and the information berth
// sends (message ID, type, correlation ID): as three native String
// attributes, or (oneAttr) as one String attribute holding them as JSON,
// the shape berth sends. What an application without berth sends.
func rawSQSSend(ctx context.Context, client *awssqs.Client, url string, n int, body string, oneAttr bool) error {
	str := func(v string) sqstypes.MessageAttributeValue {
		return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	type meta struct {
		ID            string `json:"id"`
		Type          string `json:"type"`
		CorrelationID string `json:"correlation_id"`
	}
	batches := (n + 9) / 10
	return spread(sqsSenders, batches, func(i int) error {
		k := min(10, n-i*10)
		entries := make([]sqstypes.SendMessageBatchRequestEntry, k)
		for j := range entries {
			id := sdk.NewID()
			entries[j] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), MessageBody: aws.String(body)}
			if oneAttr {
				js, err := json.Marshal(meta{ID: id, Type: "bench", CorrelationID: id})
				if err != nil {
					return err
				}
				entries[j].MessageAttributes = map[string]sqstypes.MessageAttributeValue{"meta": str(string(js))}
			} else {
				entries[j].MessageAttributes = map[string]sqstypes.MessageAttributeValue{"id": str(id), "type": str("bench"), "correlation-id": str(id)}
			}
		}
		out, err := client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries}, sqs.SafeRequestBody())
		if err != nil {
			return err
		}
		if len(out.Failed) > 0 {
			return fmt.Errorf("SendMessageBatch: %d entries failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
		return nil
	})
}

func sqsPublish(ctx context.Context, c config) (table, error) {
	e, err := newSQSEnv()
	if err != nil {
		return table{}, err
	}
	defer e.close()
	bodyBytes := make([]byte, bodySize)
	for i := range bodyBytes {
		bodyBytes[i] = 'a' + byte(i%26) // SQS bodies are text: 256 B of it, sent as is by both
	}
	body := string(bodyBytes)

	rawVariant := func(name string, oneAttr bool) (variant, error) {
		client := sqsClientNamed(name)
		_, url, err := e.queue(ctx, "sqsrawpub")
		if err != nil {
			return variant{}, err
		}
		cfg := fmt.Sprintf("%d goroutines each looping SendMessageBatch of 10; ID, type and correlation ID as 3 String attributes", sqsSenders)
		if oneAttr {
			cfg = fmt.Sprintf("%d goroutines each looping SendMessageBatch of 10; ID, type and correlation ID as JSON in one String attribute (berth's shape)", sqsSenders)
		}
		return variant{name: name, config: cfg, round: func(ctx context.Context, n int) (time.Duration, error) {
			return timed(func() error { return rawSQSSend(ctx, client, url, n, body, oneAttr) })
		}}, nil
	}
	raw, err := rawVariant("raw aws-sdk-go-v2, one JSON attribute", true)
	if err != nil {
		return table{}, err
	}
	raw3, err := rawVariant("raw aws-sdk-go-v2, 3 attributes", false)
	if err != nil {
		return table{}, err
	}
	vs := []variant{raw, raw3}
	senders := 0 // the next variant's PublishSenders; 0: the default
	add := func(name, cfg string, round func(br *sqs.Broker, q string) func(ctx context.Context, n int) (time.Duration, error)) error {
		br, err := e.brokerNamed(name, sqs.Options{PublishSenders: senders})
		if err != nil {
			return err
		}
		q, _, err := e.queue(ctx, "sqs"+strconv.Itoa(len(vs)))
		if err != nil {
			return err
		}
		vs = append(vs, variant{name: name, config: cfg, round: round(br, q)})
		return nil
	}
	msg := func() *sdk.Message { return &sdk.Message{Type: "bench", Body: bodyBytes} }

	// berth Publish of 10, from as many goroutines as raw: the same calls,
	// berth's per-message work on top.
	if err := add("berth Publish of 10", fmt.Sprintf("%d goroutines each calling Publish with 10 messages (one SendMessageBatch each)", sqsSenders),
		func(br *sqs.Broker, q string) func(context.Context, int) (time.Duration, error) {
			return func(ctx context.Context, n int) (time.Duration, error) {
				return timed(func() error {
					return spread(sqsSenders, (n+9)/10, func(i int) error {
						batch := make([]*sdk.Message, min(10, n-i*10))
						for j := range batch {
							batch[j] = msg()
						}
						return br.Publish(ctx, q, batch...)
					})
				})
			}
		}); err != nil {
		return table{}, err
	}
	// berth's asynchronous publish from one goroutine.
	asyncOpts := sdk.AsyncOptions{MaxInFlight: 256, MaxBatch: 10, Senders: sqsSenders}
	if err := add("berth PublishAsync, one goroutine", fmt.Sprintf("sdk.NewAsyncPublisher, AsyncOptions{MaxInFlight: %d, MaxBatch: %d, Senders: %d}; every result awaited at the end of the round", asyncOpts.MaxInFlight, asyncOpts.MaxBatch, asyncOpts.Senders),
		func(br *sqs.Broker, q string) func(context.Context, int) (time.Duration, error) {
			return func(ctx context.Context, n int) (time.Duration, error) {
				return timed(func() error {
					ap := sdk.NewAsyncPublisher(br, asyncOpts)
					defer ap.Close()
					return asyncRound(ctx, ap, q, n, msg)
				})
			}
		}); err != nil {
		return table{}, err
	}
	// Many goroutines, one message each: an HTTP service enqueuing per request.
	for _, senders = range []int{0, 4} {
		k := 64
		name, cfg := fmt.Sprintf("berth Publish, %d goroutines × 1 message", k), fmt.Sprintf("each call waits for its own send; default PublishSenders (%d); while a call of 10 is in flight at most one of fewer is too, the others queue and share calls", sqs.DefaultPublishSenders)
		if senders != 0 {
			name, cfg = fmt.Sprintf("berth Publish, %d goroutines × 1 message, PublishSenders %d", k, senders), fmt.Sprintf("as above, at most %d calls in flight: larger shared batches", senders)
		}
		if err := add(name, cfg,
			func(br *sqs.Broker, q string) func(context.Context, int) (time.Duration, error) {
				return func(ctx context.Context, n int) (time.Duration, error) {
					return timed(func() error {
						return callers(k, n, func() error { return br.Publish(ctx, q, msg()) })
					})
				}
			}); err != nil {
			return table{}, err
		}
	}
	senders = 0
	costs := map[string]*drainCost{}
	for i := range vs { // every publish round is timed whole
		dc, name, round := &drainCost{}, vs[i].name, vs[i].round
		costs[name] = dc
		vs[i].round = func(ctx context.Context, n int) (time.Duration, error) {
			return costed(dc, fauxqsProc, name, n, func() (time.Duration, error) { return round(ctx, n) })
		}
	}
	n := msgs(c, 10000)
	res, err := alternate(ctx, vs, sqsRoundsX*c.rounds, n)
	if err != nil {
		return table{}, err
	}
	return table{
		title: "SQS publish (fauxqs emulator on loopback, 256 B text bodies)",
		intro: fmt.Sprintf("%d rounds of %d messages per variant (three times the other scenarios' rounds: the emulator's rounds are noisy), each variant its own queue and its own client (HTTP pool of up to 128 idle connections). berth carries ID, type and correlation ID in one JSON attribute; the reference raw loop sends the same in the same shape, the second raw loop as three native attributes (which costs more: the client computes and checks an MD5 over every attribute). × is against raw with one JSON attribute; the raw loops pass sqs.SafeRequestBody(), as the Broker does (see the consume table). Per message sent: this process's CPU time (GC included), the emulator's, and this process's heap allocations.", sqsRoundsX*c.rounds, n),
		head:  []string{"variant", "msgs/s", "rounds (min–max)", "×", "client CPU/msg", "emulator CPU/msg", "allocs/msg", "configuration"},
		rows:  costRows(rows(res, 0), costs),
	}, nil
}

// asyncRound publishes n messages through ap from one goroutine and waits
// for every result.
func asyncRound(ctx context.Context, ap sdk.AsyncPublisher, q string, n int, msg func() *sdk.Message) error {
	results := make([]*sdk.PublishResult, 0, n)
	for range n {
		r, err := ap.PublishAsync(ctx, q, msg())
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	for _, r := range results {
		if err := r.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// fillSQS publishes n berth messages to q (untimed): both sides consume
// the same messages.
func fillSQS(ctx context.Context, br *sqs.Broker, q string, n int, body []byte) error {
	return spread(sqsSenders, (n+9)/10, func(i int) error {
		batch := make([]*sdk.Message, min(10, n-i*10))
		for j := range batch {
			batch[j] = &sdk.Message{Type: "bench", Body: body}
		}
		return br.Publish(ctx, q, batch...)
	})
}

func sqsConsume(ctx context.Context, c config) (table, error) {
	e, err := newSQSEnv()
	if err != nil {
		return table{}, err
	}
	defer e.close()
	body := make([]byte, bodySize)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	filler, err := e.broker(sqs.Options{})
	if err != nil {
		return table{}, err
	}

	costs := map[string]*drainCost{}
	rawVariant := func(loops int, why string) (variant, error) {
		client := sqsClientNamed(fmt.Sprintf("raw-consume-%d", loops))
		name := fmt.Sprintf("raw aws-sdk-go-v2, %d receive loops", loops)
		c := &drainCost{}
		costs[name] = c
		return variant{name: name, config: fmt.Sprintf("%d goroutines each looping ReceiveMessage (10, long poll %d s, visibility %d s, all attributes) then DeleteMessageBatch of what it received%s", loops, sqsWait, sqsVisibility, why),
			round: func(ctx context.Context, n int) (time.Duration, error) {
				q, url, err := e.queue(ctx, "sqsrawcons")
				if err != nil {
					return 0, err
				}
				if err := fillSQS(ctx, filler, q, n, body); err != nil {
					return 0, err
				}
				return costed(c, fauxqsProc, fmt.Sprintf("raw%d", loops), n, func() (time.Duration, error) {
					return timed(func() error { return rawSQSDrain(ctx, client, url, n, loops) })
				})
			}}, nil
	}
	raw, err := rawVariant(2*sqsLoops, fmt.Sprintf(": as many calls in flight as berth's %d receive loops and its 4 delete senders", sqsLoops))
	if err != nil {
		return table{}, err
	}
	raw4, err := rawVariant(sqsLoops, "")
	if err != nil {
		return table{}, err
	}
	worker := func(loops int) (variant, error) {
		br, err := e.brokerNamed(fmt.Sprintf("worker-%d", loops), sqs.Options{})
		if err != nil {
			return variant{}, err
		}
		name := fmt.Sprintf("berth Worker, ReceiveLoops %d", loops)
		c := &drainCost{}
		costs[name] = c
		return variant{name: name,
			config: fmt.Sprintf("Concurrency %d (Prefetch as many), ReceiveLoops %d%s, no-op handler; acks buffered into DeleteMessageBatch (AckInterval 20 ms), the clock stops once they are flushed (stopping the Worker is not timed)", sqsWorkers, loops, defaultLoops(loops)),
			round: func(ctx context.Context, n int) (time.Duration, error) {
				q, _, err := e.queue(ctx, "sqsworker"+strconv.Itoa(loops))
				if err != nil {
					return 0, err
				}
				if err := fillSQS(ctx, filler, q, n, body); err != nil {
					return 0, err
				}
				return costed(c, fauxqsProc, fmt.Sprint("worker", loops), n, func() (time.Duration, error) {
					return drainWorker(ctx, br, q, n, sdk.WorkerOptions{Concurrency: sqsWorkers, ReceiveLoops: loops})
				})
			}}, nil
	}
	par, err := worker(sqsLoops)
	if err != nil {
		return table{}, err
	}
	par8, err := worker(2 * sqsLoops)
	if err != nil {
		return table{}, err
	}
	one, err := worker(1)
	if err != nil {
		return table{}, err
	}
	n := msgs(c, envInt("BERTH_BENCH_SQSN", 5000))
	res, err := alternate(ctx, []variant{raw, raw4, par, par8, one}, sqsRoundsX*c.rounds, n)
	if err != nil {
		return table{}, err
	}
	return table{
		title: "SQS consume + delete (fauxqs emulator on loopback, 256 B)",
		intro: fmt.Sprintf("%d rounds per variant (three times the other scenarios' rounds: the emulator's rounds are noisy). Each round first fills the variant's queue with %d berth messages (untimed), then times draining them: from the start of the consumer to the last delete answered. Every round has a new queue (declared untimed): a long poll cut short when a consumer stops may still take messages on the server and hide them for the visibility timeout, which would stall a later round on the same queue. Both sides pass sqs.SafeRequestBody() to their calls (the Broker does on every call): without it, one round in four or so lost a ReceiveMessage answer to a race between net/http and smithy-go (\"use of closed network connection\" under a 200 answer, the SDK retried, the messages taken stayed hidden for the 10 s visibility: a round 10 s long). × is against raw with %d loops. The drains are CPU-bound on this machine: the columns give, per message drained, this process's CPU time (the consumer, GC included), the emulator's, and this process's heap allocations; a variant that spends more client CPU per message leaves the emulator less.", sqsRoundsX*c.rounds, n, 2*sqsLoops),
		head:  []string{"variant", "msgs/s", "rounds (min–max)", "×", "client CPU/msg", "emulator CPU/msg", "allocs/msg", "configuration"},
		rows:  costRows(rows(res, 0), costs),
	}, nil
}

// rawSQSDrain consumes and deletes n messages with loops concurrent
// receive loops.
func rawSQSDrain(ctx context.Context, client *awssqs.Client, url string, n, loops int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, loops)
	for range loops {
		wg.Go(func() {
			for got.Load() < int64(n) {
				out, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
					QueueUrl: aws.String(url), MaxNumberOfMessages: 10, VisibilityTimeout: sqsVisibility, WaitTimeSeconds: sqsWait,
					MessageAttributeNames:       []string{"All"},
					MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
				}, sqs.SafeRequestBody())
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
						cancel()
					}
					return
				}
				if len(out.Messages) == 0 {
					continue
				}
				entries := make([]sqstypes.DeleteMessageBatchRequestEntry, len(out.Messages))
				for i, m := range out.Messages {
					entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
				}
				del, err := client.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries}, sqs.SafeRequestBody())
				if err == nil && len(del.Failed) > 0 {
					err = fmt.Errorf("DeleteMessageBatch: %d entries failed", len(del.Failed))
				}
				if err != nil {
					errc <- err
					cancel()
					return
				}
				if got.Add(int64(len(out.Messages))) >= int64(n) {
					cancel() // the others' long polls end
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// drainWorker runs a Worker with a no-op handler on q until n deliveries
// were acked and the broker's buffered acks are flushed, and returns how long
// that took from the start of Run; stopping the Worker afterwards is not
// timed (the raw loops' clocks stop at their last delete too).
func drainWorker(ctx context.Context, br sdk.Broker, q string, n int, opts sdk.WorkerOptions) (time.Duration, error) {
	cnt := &counter{}
	done := cnt.expect(int64(n))
	opts.Queue = q
	opts.Observers = []sdk.Observer{ackObserver{cnt}}
	opts.Logger = slog.New(slog.DiscardHandler)
	w, err := sdk.NewWorker(br, sdk.HandlerFunc(func(context.Context, sdk.Delivery) error { return nil }), opts)
	if err != nil {
		return 0, err
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- w.Run(wctx) }()
	select {
	case <-done:
	case err := <-errc:
		return 0, fmt.Errorf("worker stopped early: %v", err)
	}
	if f, ok := br.(sdk.Flusher); ok {
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := f.Flush(fctx)
		cancel()
		if err != nil {
			stop()
			<-errc
			return 0, err
		}
	}
	elapsed := time.Since(start)
	stop()
	return elapsed, <-errc
}

// spread runs job(0) … job(n-1) on k goroutines and returns the first error.
func spread(k, n int, job func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range k {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := job(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n)) // the others stop
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// defaultLoops notes when loops is what a Worker of sqsWorkers handlers
// (Prefetch as many) picks for itself on SQS.
func defaultLoops(loops int) string {
	if loops == min((2*sqsWorkers+9)/10, sdk.MaxDefaultReceiveLoops) {
		return " (the default for these slots)"
	}
	return ""
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// fauxqsProc matches the SQS emulator's process: node running fauxqs.
func fauxqsProc(cmdline string) bool {
	return strings.HasPrefix(cmdline, "node") && (strings.Contains(cmdline, "fauxqs") || strings.Contains(cmdline, "server.mjs"))
}

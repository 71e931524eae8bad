package sqs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"golang.org/x/sync/singleflight"

	"github.com/berthq/berth/sdk"
)

// Limits of SQS that the broker enforces before calling it.
const (
	// MaxVisibility is the longest visibility timeout SQS allows, counted from
	// the message's receipt.
	MaxVisibility = 12 * time.Hour
	// MaxPublishDelay is the longest delay SQS allows at publish.
	MaxPublishDelay = 15 * time.Minute
	// MaxWaitTime is the longest long-poll wait SQS allows.
	MaxWaitTime = 20 * time.Second
	// DefaultMaxMessageSize is the default [Options.MaxMessageSize]: 256 KiB.
	DefaultMaxMessageSize = 256 << 10
	// MaxWireSize is the largest message SQS accepts (body plus attributes),
	// and the largest SendMessageBatch request: 1 MiB.
	MaxWireSize = 1 << 20
	// batchSize is SQS's maximum number of entries per batch call and of
	// messages per ReceiveMessage.
	batchSize = 10
	// maxQueueNameLen is SQS's limit on queue names, ".fifo" included.
	maxQueueNameLen = 80
)

// Options configures a [Broker]. The zero value gives sensible defaults.
type Options struct {
	// VisibilityTimeout is the lease of every received message, and the
	// queue default that DeclareQueue sets. Rounded up to whole seconds,
	// between 1 s and 12 h. Default 30 s.
	VisibilityTimeout time.Duration
	// WaitTime is the long-poll wait of Receive on an empty queue. Rounded up
	// to whole seconds, between 1 s and 20 s (it is never 0, which would make
	// callers busy-loop). Default 20 s.
	WaitTime time.Duration
	// MaxReceiveCount is the redrive policy that DeclareQueue sets: a message
	// received that many times without being settled is moved to the
	// dead-letter queue by SQS. Default 10, so that the Worker's own
	// MaxAttempts (default 5) normally dead-letters first, with the reason.
	MaxReceiveCount int
	// DeadLetterSuffix names the dead-letter queue of queue q when q has no
	// redrive policy to read it from: q+DeadLetterSuffix (before ".fifo").
	// Default "-dlq".
	DeadLetterSuffix string
	// AckInterval is how long a buffered delete may wait for more deletes to
	// share its DeleteMessageBatch call. Default 20 ms. A delete sent when
	// its lease has run out, or has less than 250 ms left, is first checked
	// with ChangeMessageVisibilityBatch, which extends the lease while the
	// delete follows: the delete of a receipt that no longer holds its
	// message (received again since, or visible again) is not sent, and
	// fails with an error wrapping [sdk.ErrLeaseLost] (see [Broker.Flush]),
	// rather than being reported deleted while the message runs again. An interval near the visibility timeout makes such
	// checks, and lost leases, frequent.
	AckInterval time.Duration
	// SyncAck makes Ack wait until its delete was sent and return its error.
	// Default false: Ack returns once the delete is buffered. An Ack whose
	// ctx ends first returns ctx's error and leaves the delete under way; a
	// failure of it is then logged and returned by the next Flush, as for a
	// buffered delete.
	SyncAck bool
	// MaxMessageSize bounds [sdk.Message.Size] at publish. Default 256 KiB;
	// at most MaxWireSize.
	MaxMessageSize int
	// MaxWireSize bounds the encoded message (body and attributes, as SQS
	// counts them). The limit a message must fit is MaxWireSize or, when
	// that is smaller, the queue's own MaximumMessageSize (DeclareQueue sets
	// it to MaxWireSize; a queue made elsewhere may have less), which the
	// broker reads once per queue and again every minute, or at once after
	// SQS refused an entry as invalid (the attribute may have been lowered);
	// without sqs:GetQueueAttributes it checks MaxWireSize only, and logs so.
	// Publish keeps 83 bytes of that limit for the copies berth sends of a
	// message (its dead letter, a redrive): it refuses an encoded message
	// over the limit less those, before anything is sent. DeadLetter fits
	// its copy to the dead-letter queue's limit; the guarantee that every
	// message Publish accepts can be dead-lettered holds when the
	// dead-letter queue's MaximumMessageSize is at least its source queue's.
	// Default and maximum [MaxWireSize] (1 MiB).
	MaxWireSize int
	// PublishSenders bounds the SendMessageBatch calls in flight for the
	// Publish calls of at most 10 messages to standard queues. A Publish that
	// finds one free sends at once, with what else of its queue waits (up to
	// 10); one that finds them all busy queues its messages for the next free
	// sender (group commit). Under load — while a call of 10 to the queue is
	// in flight — at most one call of fewer is in flight too (Nagle's rule):
	// messages then wait, at most one call's round trip, to fill calls of 10.
	// Many goroutines publishing one message each so share full calls
	// instead of making one each. Larger Publish calls and FIFO queues do not
	// take part. Default [DefaultPublishSenders] (16).
	PublishSenders int
	// DefaultGroup is the FIFO MessageGroupId of messages published
	// without a Key. Default "berth". A dead letter and a redrive do not
	// use it: they keep the group the message was received with, so that
	// Brokers with different DefaultGroups (other services, other
	// deployments) do not move a message out of its group.
	DefaultGroup string
	// Logger receives the broker's logs (failed deletes). Default slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.VisibilityTimeout == 0 {
		o.VisibilityTimeout = 30 * time.Second
	}
	if o.VisibilityTimeout < 0 || o.VisibilityTimeout > MaxVisibility {
		return o, fmt.Errorf("berth/sqs: VisibilityTimeout %s outside (0, %s]", o.VisibilityTimeout, MaxVisibility)
	}
	if o.WaitTime == 0 {
		o.WaitTime = MaxWaitTime
	}
	if o.WaitTime < 0 || o.WaitTime > MaxWaitTime {
		return o, fmt.Errorf("berth/sqs: WaitTime %s outside (0, %s]", o.WaitTime, MaxWaitTime)
	}
	if o.MaxReceiveCount == 0 {
		o.MaxReceiveCount = 10
	}
	if o.MaxReceiveCount < 1 || o.MaxReceiveCount > 1000 {
		return o, fmt.Errorf("berth/sqs: MaxReceiveCount %d outside [1, 1000]", o.MaxReceiveCount)
	}
	if o.DeadLetterSuffix == "" {
		o.DeadLetterSuffix = "-dlq"
	}
	if !sqsNameChars("q" + o.DeadLetterSuffix) {
		return o, fmt.Errorf("berth/sqs: DeadLetterSuffix %q: only letters, digits, '-' and '_'", o.DeadLetterSuffix)
	}
	if o.AckInterval == 0 {
		o.AckInterval = 20 * time.Millisecond
	}
	if o.AckInterval < 0 {
		return o, fmt.Errorf("berth/sqs: negative AckInterval %s", o.AckInterval)
	}
	if o.MaxWireSize == 0 {
		o.MaxWireSize = MaxWireSize
	}
	if o.MaxWireSize < 1024 || o.MaxWireSize > MaxWireSize {
		return o, fmt.Errorf("berth/sqs: MaxWireSize %d outside [1024, %d]", o.MaxWireSize, MaxWireSize)
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = min(DefaultMaxMessageSize, o.MaxWireSize)
	}
	if o.MaxMessageSize < 1 || o.MaxMessageSize > o.MaxWireSize {
		return o, fmt.Errorf("berth/sqs: MaxMessageSize %d outside [1, %d]", o.MaxMessageSize, o.MaxWireSize)
	}
	if o.DefaultGroup == "" {
		o.DefaultGroup = "berth"
	}
	if o.PublishSenders == 0 {
		o.PublishSenders = DefaultPublishSenders
	}
	if o.PublishSenders < 0 {
		return o, fmt.Errorf("berth/sqs: negative PublishSenders %d", o.PublishSenders)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// Broker is an [sdk.Broker] on SQS. It also implements [sdk.QueueDeclarer],
// [sdk.Inspector], [sdk.DeadLetters] and [sdk.Flusher]. All its methods may be
// called concurrently.
type Broker struct {
	client *awssqs.Client
	opts   Options
	acks   *acker
	co     *coalescer // shares SendMessageBatch calls between small Publish calls

	// closing is cancelled by Close; every blocking call stops with it.
	closing context.Context
	cancel  context.CancelFunc
	closed  atomic.Bool
	once    sync.Once

	mu      sync.Mutex
	queues  map[string]*queueRef // by name
	lookups singleflight.Group   // GetQueueUrl calls under way, by queue name

	// Dead-letter scans: how long a receive hides a letter, and how many
	// letters one scan may hold (defaultHold, defaultMaxHeld; tests shorten
	// them).
	scanHold time.Duration
	scanMax  int
}

// queueRef is a resolved queue: its URL (looked up once) and, on first need,
// its dead-letter queue.
type queueRef struct {
	name string
	url  string
	fifo bool

	// dlqLock (one slot) guards dlq and the writes of maxReceive: a lookup holds it
	// across its calls, and a caller waiting for it stops when its ctx
	// ends (a sync.Mutex would hold it for as long as the other caller's
	// calls take).
	dlqLock chan struct{}
	dlq     *queueRef
	// maxReceive is the redrive policy's maxReceiveCount, 0 when unknown;
	// atomic: a scan's annotate reads it without dlqLock.
	maxReceive atomic.Int64

	// polls are this Broker's long polls of the queue, those given up that
	// may still wait on the server among them: what the Broker makes
	// visible waits for those to end.
	polls polls

	// size is the queue's MaximumMessageSize, read on first need and again
	// every sizeRefresh ([Broker.maxSize]): Publish checks messages against
	// it, DeadLetter and redrives their copies.
	size queueSize
}

// New returns a Broker that uses client, which the caller configured
// (region, credentials, endpoint, retries, APIOptions). Close does not close
// the client's HTTP connections.
func New(client *awssqs.Client, opts Options) (*Broker, error) {
	if client == nil {
		return nil, errors.New("berth/sqs: nil *sqs.Client")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Broker{
		client:  client,
		opts:    o,
		closing: ctx,
		cancel:  cancel,
		queues:  make(map[string]*queueRef),

		scanHold: defaultHold,
		scanMax:  defaultMaxHeld,
	}
	b.acks = newAcker(client, o.AckInterval, o.VisibilityTimeout, o.Logger, b.wrapDelete)
	b.co = newCoalescer(o.PublishSenders, b.closing)
	return b, nil
}

// NewFromConfig returns a Broker on a new *sqs.Client built from cfg and optFns.
func NewFromConfig(cfg aws.Config, opts Options, optFns ...func(*awssqs.Options)) (*Broker, error) {
	return New(awssqs.NewFromConfig(cfg, optFns...), opts)
}

// Client returns the SQS client the broker uses.
func (b *Broker) Client() *awssqs.Client { return b.client }

// Close sends the buffered deletes (waiting at most 10 s for them, plus, if
// SQS hangs, the rest of the 30 s timeout of a delete call in flight), stops
// the broker's goroutines and unblocks every Receive in progress, which returns
// [sdk.ErrClosed], as does every later call. Unsettled deliveries come back
// after their visibility timeout. If the 10 s run out, Close's error says so
// and how many buffered deletes it did not send (it matches
// [context.DeadlineExceeded]); their messages come back too. Close is safe to
// call twice; the second call returns nil.
func (b *Broker) Close() error {
	var err error
	b.once.Do(func() {
		b.closed.Store(true)
		b.cancel()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = b.acks.close(ctx)
		b.co.senders.close() // their calls end with b.closing
	})
	return err
}

// Flush sends the buffered deletes now and waits for them (and for those
// being sent; not for deletes added meanwhile, which other consumers of the
// broker may keep adding), returning the errors of deletes SQS refused since
// the last Flush ([AckError]). It implements [sdk.Flusher].
func (b *Broker) Flush(ctx context.Context) error {
	if b.closed.Load() {
		return sdk.ErrClosed
	}
	return b.acks.flush(ctx)
}

// watch returns a context that is cancelled with ctx or when the broker
// closes (wrap then reports [sdk.ErrClosed]), and the function that releases
// it.
func (b *Broker) watch(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(b.closing, cancel)
	return ctx, func() { stop(); cancel() }
}

// queue returns the resolved queue name, looking its URL up once.
func (b *Broker) queue(ctx context.Context, name string) (*queueRef, error) {
	if err := validateQueueName(name); err != nil {
		return nil, err
	}
	for {
		if q := b.cached(name); q != nil {
			return q, nil
		}
		// Callers that miss the cache at once (a service starting with many
		// publishers) share one GetQueueUrl call rather than make one each.
		// The call runs in singleflight's goroutine under the context of
		// the caller that started it; see lookupOutcome.
		res := b.lookups.DoChan(name, func() (v any, err error) {
			defer func() {
				if p := recover(); p != nil { // re-raised in every waiting caller's goroutine
					v, err = lookupOutcome{panicked: true, panic: p}, errLookupPanicked
				}
			}()
			if q := b.cached(name); q != nil {
				return lookupOutcome{q: q}, nil
			}
			out, err := b.client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(name)}, withBody)
			if err != nil {
				return lookupOutcome{starterGone: ctx.Err() != nil}, b.wrap(ctx, "resolve queue "+name, err)
			}
			return lookupOutcome{q: b.remember(name, aws.ToString(out.QueueUrl))}, nil
		})
		select {
		case r := <-res:
			o, _ := r.Val.(lookupOutcome)
			switch {
			case o.panicked:
				panic(o.panic)
			case r.Err == nil:
				return o.q, nil
			case ctx.Err() != nil:
				return nil, b.wrap(ctx, "resolve queue "+name, ctx.Err()) // this caller's own error, not the call's
			case o.starterGone:
				// The call ended because the caller that started it gave up;
				// this caller has not: it looks the queue up again. A call
				// that failed otherwise (a timeout of the transport included,
				// which also matches context.DeadlineExceeded) is its error.
				continue
			}
			return nil, r.Err
		case <-ctx.Done():
			return nil, b.wrap(ctx, "resolve queue "+name, ctx.Err())
		}
	}
}

// lookupOutcome is what a shared GetQueueUrl call gives the callers that
// wait for it: the queue, or whether the call failed because the context of
// the caller that started it ended (the others then call again), or the
// value of a panic in the call (raised again in each caller).
type lookupOutcome struct {
	q           *queueRef
	starterGone bool
	panicked    bool
	panic       any
}

// errLookupPanicked marks a shared lookup that panicked; callers re-panic
// with the value instead of returning it.
var errLookupPanicked = errors.New("berth/sqs: queue lookup panicked")

// cached returns the cached reference of queue name, or nil.
func (b *Broker) cached(name string) *queueRef {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.queues[name]
}

// remember caches the URL of queue name.
func (b *Broker) remember(name, url string) *queueRef {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.queues[name]; q != nil && q.url == url {
		return q
	}
	q := &queueRef{name: name, url: url, fifo: strings.HasSuffix(name, fifoSuffix)}
	q.size.read = make(chan struct{}, 1)
	q.dlqLock = make(chan struct{}, 1)
	b.queues[name] = q
	return q
}

// forget drops the cached URL of queue name (after the queue was deleted).
func (b *Broker) forget(name string) {
	b.mu.Lock()
	delete(b.queues, name)
	b.mu.Unlock()
}

// deadLetterQueue returns q's dead-letter queue: the target of its redrive
// policy, else q's name with the dead-letter suffix.
func (b *Broker) deadLetterQueue(ctx context.Context, q *queueRef) (*queueRef, error) {
	select {
	case q.dlqLock <- struct{}{}:
	case <-ctx.Done():
		return nil, b.wrap(ctx, "read redrive policy of "+q.name, ctx.Err())
	}
	defer func() { <-q.dlqLock }()
	if q.dlq != nil {
		return q.dlq, nil
	}
	name := b.deadLetterName(q.name)
	out, err := b.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(q.url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameRedrivePolicy},
	}, withBody)
	if err != nil {
		return nil, b.wrap(ctx, "read redrive policy of "+q.name, err)
	}
	if p := out.Attributes[string(sqstypes.QueueAttributeNameRedrivePolicy)]; p != "" {
		var policy struct {
			Target string `json:"deadLetterTargetArn"`
			Max    any    `json:"maxReceiveCount"` // a string or a number
		}
		if json.Unmarshal([]byte(p), &policy) == nil && policy.Target != "" {
			name = policy.Target[strings.LastIndexByte(policy.Target, ':')+1:]
			n, _ := strconv.Atoi(fmt.Sprint(policy.Max))
			q.maxReceive.Store(int64(n))
		}
	}
	if err := validateQueueName(name); err != nil {
		// No SQS queue has that name (q's name is too long for the suffix):
		// q has no dead-letter queue, as when the lookup finds none.
		return nil, fmt.Errorf("berth/sqs: dead-letter queue of %s: %w: %v", q.name, sdk.ErrNotFound, err)
	}
	dlq, err := b.queue(ctx, name)
	if err != nil {
		return nil, err
	}
	q.dlq = dlq
	return dlq, nil
}

// deadLetterName is the conventional dead-letter queue name of queue.
func (b *Broker) deadLetterName(queue string) string {
	if base, ok := strings.CutSuffix(queue, fifoSuffix); ok {
		return base + b.opts.DeadLetterSuffix + fifoSuffix
	}
	return queue + b.opts.DeadLetterSuffix
}

// wrap turns an SDK error into a berth error: context errors unwrapped,
// a missing queue wrapping [sdk.ErrNotFound], the broker's own shutdown
// [sdk.ErrClosed], transport failures, success answers that could not
// be read (cut short) and a gateway's 502 or 504 (viaGateway)
// [sdk.ErrUnavailable].
func (b *Broker) wrap(ctx context.Context, what string, err error) error {
	if b.closing.Err() != nil {
		return sdk.ErrClosed
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return ctx.Err()
	}
	var missing *sqstypes.QueueDoesNotExist
	if errors.As(err, &missing) || apiCode(err) == "AWS.SimpleQueueService.NonExistentQueue" {
		return fmt.Errorf("berth/sqs: %s: %w: %w", what, sdk.ErrNotFound, err)
	}
	if isTransport(err) || answerCut(err) || viaGateway(err) {
		return fmt.Errorf("berth/sqs: %s: %w: %w", what, sdk.ErrUnavailable, err)
	}
	return fmt.Errorf("berth/sqs: %s: %w", what, err)
}

// wrapDelete maps the error of a DeleteMessageBatch call as wrap does a
// Publish's: [sdk.ErrClosed] once the broker is closing, [sdk.ErrNotFound]
// for a missing queue, [sdk.ErrUnavailable] when SQS cannot be reached. ctx
// is the acker's own (a timeout per call), not a caller's: its end means
// SQS did not answer in time, hence ErrUnavailable. The cause is kept.
func (b *Broker) wrapDelete(ctx context.Context, what string, err error) error {
	if b.closing.Err() != nil {
		return fmt.Errorf("berth/sqs: %s: %w: %w", what, sdk.ErrClosed, err)
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("berth/sqs: %s: %w: %w", what, sdk.ErrUnavailable, err)
	}
	return b.wrap(context.Background(), what, err)
}

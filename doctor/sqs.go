package doctor

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// sqsMaxVisibility is the longest SQS keeps a message invisible after a
// receive, extensions included.
const sqsMaxVisibility = 12 * time.Hour

func asSQS(b sdk.Broker) *sqs.Broker {
	var sb *sqs.Broker
	if as, ok := b.(interface{ As(any) bool }); ok && as.As(&sb) {
		return sb
	}
	sb, _ = b.(*sqs.Broker)
	return sb
}

// SQS runs the SQS checks on each of opts.Queues: sqs.queue-missing,
// sqs.redrive-policy, sqs.max-receive-count, sqs.visibility-timeout,
// sqs.dlq-retention, sqs.long-polling, and sqs.queue-attributes (info:
// doctor's credentials may not read a queue's attributes, so the checks
// that need them are not made). Each queue's checks are bounded by
// Options.CheckTimeout (doctor.check-timeout).
//
// An SQS broker opens without a request, so the checks of the first queue
// send the first requests, and they tell whether the endpoint can be
// reached: one that refuses the connection, whose host name does not
// resolve, whose TLS handshake fails, that refuses doctor's credentials or
// whose requests cannot be sent otherwise (and a client whose credential
// chain finds no credentials, checked before the first request) is the
// error finding doctor.broker-unreachable (the finding berth doctor gives a RabbitMQ or
// PostgreSQL it cannot open), alone: no queue is checked. One that does
// not answer in time is doctor.check-timeout on each queue, as before.
func SQS(ctx context.Context, b *sqs.Broker, opts Options) ([]Finding, error) {
	fs, _, err := sqsChecks(ctx, b, opts.withDefaults())
	Sort(fs)
	return fs, err
}

// sqsChecks runs the SQS checks; down reports that the endpoint could not
// be reached (fs then holds the one finding that says so).
func sqsChecks(ctx context.Context, b *sqs.Broker, o Options) (fs []Finding, down bool, err error) {
	if len(o.Queues) == 0 {
		return nil, false, ErrNoQueues
	}
	if f := sqsNoCredentials(ctx, b.Client(), o); f != nil {
		return []Finding{*f}, true, nil
	}
	for i, q := range o.Queues {
		qf, err := bounded(ctx, o, "SQS checks of the queue", q, func(ctx context.Context) ([]Finding, error) {
			return sqsQueue(ctx, b, q, o)
		})
		if err != nil && i == 0 && ctx.Err() == nil {
			// The first queue's requests are the first the broker
			// sends: they tell whether the endpoint can be reached.
			if f := sqsUnreachable(b.Client(), q, err); f != nil {
				return []Finding{*f}, true, nil
			}
		}
		if err != nil {
			return fs, false, err
		}
		fs = append(fs, qf...)
	}
	return fs, false, nil
}

// brokerUnreachableID is the ID of the finding of a broker that cannot be
// reached.
const brokerUnreachableID = "doctor.broker-unreachable"

// sqsUnreachable returns the doctor.broker-unreachable finding of err, the
// error of the checks of queue q through the SQS client c, when it says
// that the endpoint could not be reached or refused the credentials; nil
// when SQS answered (its other errors are the checks' to report).
func sqsUnreachable(c *awssqs.Client, q string, err error) *Finding {
	what, fix := sqsFailure(err)
	if what == "" {
		return nil
	}
	where := "region " + c.Options().Region
	if ep := c.Options().BaseEndpoint; ep != nil {
		where = "endpoint " + redactURL(*ep) + ", " + where
	}
	return &Finding{ID: brokerUnreachableID, Severity: Error,
		Summary:  "the SQS endpoint " + what + ": no check of the broker (its queues, the Workers' options) was run",
		Evidence: fmt.Sprintf("checks of %s (%s): %v", quoted(q), where, err),
		Fix:      fix}
}

// sqsNoCredentials returns the doctor.broker-unreachable finding of a
// client whose credential chain yields none (no environment variables, no
// profile, no instance role): it signs no request, so no check could run,
// and the SDK's error says so only inside its own text. nil when the client
// has credentials (or is anonymous), and when their retrieval did not end
// within CheckTimeout (an instance metadata service that does not answer:
// the queues' checks then report doctor.check-timeout, as before).
func sqsNoCredentials(ctx context.Context, c *awssqs.Client, o Options) *Finding {
	p := c.Options().Credentials
	if p == nil {
		return nil
	}
	_, err := within(ctx, o.CheckTimeout, func(ctx context.Context) (aws.Credentials, error) { return p.Retrieve(ctx) })
	if err == nil || ctx.Err() != nil || timedOut(ctx, err) {
		return nil
	}
	return &Finding{ID: brokerUnreachableID, Severity: Error,
		Summary:  "the SQS client found no AWS credentials: no request was sent, no check of the broker (its queues, the Workers' options) was run",
		Evidence: fmt.Sprintf("region %s: %v", c.Options().Region, err),
		Fix:      "give doctor the credentials the Workers use: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE with a shared config file, or the instance's or task's role"}
}

// sqsFailure returns what happened to a request to SQS that failed with
// err, for a finding's summary, and what to check; "" when SQS answered it
// (an error of its own other than refused credentials) or the error is not
// the request's (a timeout: doctor.check-timeout).
func sqsFailure(err error) (what, fix string) {
	var (
		ae     smithy.APIError
		dns    *net.DNSError
		record tls.RecordHeaderError
		verify *tls.CertificateVerificationError
		alert  tls.AlertError
		send   *smithyhttp.RequestSendError
	)
	switch {
	case errors.As(err, &ae):
		switch ae.ErrorCode() {
		case "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "InvalidSignatureException",
			"IncompleteSignature", "MissingAuthenticationToken", "InvalidAccessKeyId", "ExpiredToken", "ExpiredTokenException":
			return "refused the credentials",
				"check the AWS credentials doctor runs with (the default chain: AWS_ACCESS_KEY_ID, AWS_PROFILE, the instance's role) and the region they are valid in"
		}
		return "", ""
	case errors.As(err, &dns) && !dns.IsTimeout:
		return "could not be reached: its host name did not resolve", "check the host name of the endpoint (-url), and the DNS this machine uses"
	case errors.As(err, &record) || errors.As(err, &verify) || errors.As(err, &alert):
		return "failed the TLS handshake", "check that the endpoint speaks TLS where the URL says https:// and that this machine trusts its certificate for its host name"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused the connection", "check that the endpoint is running and that -url names its host and port (a firewall can refuse too)"
	case errors.As(err, &send):
		return "could not be reached", "fix what the evidence names: the Workers, given the same endpoint, cannot reach it either"
	}
	return "", ""
}

// redactURL returns raw with any password replaced, or a placeholder when
// it does not parse.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an endpoint URL that does not parse)"
	}
	return u.Redacted()
}

// sqsAttributes returns a queue's attributes, nil when it does not exist.
func sqsAttributes(ctx context.Context, c *awssqs.Client, name string) (map[string]string, error) {
	u, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		var nf *sqstypes.QueueDoesNotExist
		if errors.As(err, &nf) || strings.Contains(err.Error(), "NonExistentQueue") || strings.Contains(err.Error(), "QueueDoesNotExist") {
			return nil, nil
		}
		return nil, fmt.Errorf("doctor: sqs: resolve %s: %w", quoted(name), err)
	}
	out, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: u.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
	if err != nil {
		return nil, fmt.Errorf("doctor: sqs: attributes of %s: %w", quoted(name), err)
	}
	return out.Attributes, nil
}

// accessDenied reports whether err is SQS refusing a call for want of
// permission: credentials whose IAM policy does not allow
// sqs:GetQueueUrl or sqs:GetQueueAttributes (a producer's, say).
func accessDenied(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "AccessDenied", "AccessDeniedException":
		return true
	}
	return false
}

// attributesDenied is the finding for a queue whose attributes doctor may
// not read: the checks that need them (listed in unchecked) are not made,
// and the other queues' checks still run.
func attributesDenied(name, unchecked string, err error) Finding {
	return Finding{ID: "sqs.queue-attributes", Severity: Info,
		Summary:  fmt.Sprintf("the attributes of %s could not be read (doctor's credentials may not): %s not checked", quoted(name), unchecked),
		Evidence: err.Error(),
		Fix:      "run doctor with credentials allowed sqs:GetQueueUrl and sqs:GetQueueAttributes on the queue and its dead-letter queue"}
}

func seconds(attrs map[string]string, name sqstypes.QueueAttributeName) (time.Duration, bool) {
	n, err := strconv.Atoi(attrs[string(name)])
	if err != nil {
		return 0, false
	}
	return time.Duration(n) * time.Second, true
}

func sqsQueue(ctx context.Context, b *sqs.Broker, q string, o Options) ([]Finding, error) {
	var fs []Finding
	add := func(f Finding) { f.Queue = q; fs = append(fs, f) }
	c := b.Client()
	attrs, err := sqsAttributes(ctx, c, q)
	if accessDenied(err) {
		add(attributesDenied(q, "its redrive policy, maxReceiveCount, visibility timeout, long polling and dead-letter retention are", err))
		return fs, nil
	}
	if err != nil {
		return nil, err
	}
	if attrs == nil {
		add(Finding{ID: "sqs.queue-missing", Severity: Error, Summary: "the queue does not exist",
			Evidence: fmt.Sprintf("GetQueueUrl %s: not found", quoted(q)), Fix: "create it with berth's DeclareQueue (queue, dead-letter queue and redrive policy together)"})
		return fs, nil
	}

	// Redrive policy and maxReceiveCount.
	var dlqName string
	policy := attrs[string(sqstypes.QueueAttributeNameRedrivePolicy)]
	var rp struct {
		Target string `json:"deadLetterTargetArn"`
		Max    any    `json:"maxReceiveCount"`
	}
	if policy == "" || json.Unmarshal([]byte(policy), &rp) != nil || rp.Target == "" {
		add(Finding{ID: "sqs.redrive-policy", Severity: Error, Summary: "no redrive policy: a message that crashes its consumer is received forever, and nothing caps it",
			Evidence: fmt.Sprintf("RedrivePolicy %s", quoted(policy)), Fix: "set a RedrivePolicy to a dead-letter queue (berth DeclareQueue: <queue>-dlq, maxReceiveCount 10)"})
	} else {
		dlqName = rp.Target[strings.LastIndexByte(rp.Target, ':')+1:]
		add(Finding{ID: "sqs.redrive-policy", Severity: OK, Summary: "dead letters go to " + dlqName, Evidence: "RedrivePolicy " + policy})
		n, _ := strconv.Atoi(fmt.Sprint(rp.Max))
		switch {
		case n < o.MaxAttempts:
			add(Finding{ID: "sqs.max-receive-count", Severity: Error, Summary: "maxReceiveCount is below the Worker's MaxAttempts: SQS moves the job to the dead-letter queue first, without its error",
				Evidence: fmt.Sprintf("maxReceiveCount %d < MaxAttempts %d", n, o.MaxAttempts),
				Fix:      fmt.Sprintf("raise maxReceiveCount to at least %d (a few more leave room for crash redeliveries and RetryAfter), or lower MaxAttempts", o.MaxAttempts)})
		default:
			add(Finding{ID: "sqs.max-receive-count", Severity: OK, Summary: "maxReceiveCount leaves the Worker its attempts",
				Evidence: fmt.Sprintf("maxReceiveCount %d ≥ MaxAttempts %d", n, o.MaxAttempts)})
		}
	}

	// Visibility timeout vs the handler's duration.
	vis, _ := seconds(attrs, sqstypes.QueueAttributeNameVisibilityTimeout)
	lease := b.Lease()
	ev := fmt.Sprintf("queue VisibilityTimeout %s; berth receives with %s and extends it every third of that while a handler runs; longest job %s", vis, lease, o.LongestJob)
	switch {
	case o.LongestJob < 0 || o.LongestJob > sqsMaxVisibility:
		add(Finding{ID: "sqs.visibility-timeout", Severity: Error, Summary: "the longest job outlasts SQS's 12 h visibility limit: it is delivered again while it runs",
			Evidence: ev, Fix: "split the job, or bound it below 12 h (WorkerOptions.Timeout)"})
	case vis < lease:
		add(Finding{ID: "sqs.visibility-timeout", Severity: Warn, Summary: "the queue's visibility timeout is shorter than berth's lease: consumers that do not set their own (the console, other tools) lease for less",
			Evidence: ev, Fix: fmt.Sprintf("set VisibilityTimeout to %d seconds (berth DeclareQueue does)", int(lease.Seconds()))})
	default:
		add(Finding{ID: "sqs.visibility-timeout", Severity: OK, Summary: "visibility timeout and heartbeat cover the longest job", Evidence: ev})
	}

	// Long polling.
	wait, _ := seconds(attrs, sqstypes.QueueAttributeNameReceiveMessageWaitTimeSeconds)
	if wait == 0 {
		add(Finding{ID: "sqs.long-polling", Severity: Warn, Summary: "long polling is off on the queue: consumers that do not ask for a wait short-poll (empty receives, cost, latency)",
			Evidence: "ReceiveMessageWaitTimeSeconds 0 (berth itself asks for its WaitTime on every receive)", Fix: "set ReceiveMessageWaitTimeSeconds to 20"})
	} else {
		add(Finding{ID: "sqs.long-polling", Severity: OK, Summary: "long polling is on", Evidence: fmt.Sprintf("ReceiveMessageWaitTimeSeconds %d", int(wait.Seconds()))})
	}

	// Dead-letter queue retention.
	if dlqName != "" {
		dattrs, err := sqsAttributes(ctx, c, dlqName)
		if accessDenied(err) {
			add(attributesDenied(dlqName, "the dead-letter queue's retention is", err))
			return fs, nil
		}
		if err != nil {
			return nil, err
		}
		src, _ := seconds(attrs, sqstypes.QueueAttributeNameMessageRetentionPeriod)
		switch dst, _ := seconds(dattrs, sqstypes.QueueAttributeNameMessageRetentionPeriod); {
		case dattrs == nil:
			add(Finding{ID: "sqs.dlq-retention", Severity: Error, Summary: "the redrive policy's dead-letter queue does not exist",
				Evidence: "queue " + dlqName + " not found", Fix: "create " + dlqName + " (berth DeclareQueue)"})
		case dst < src && attrs[string(sqstypes.QueueAttributeNameFifoQueue)] == "true":
			// SQS resets a FIFO message's enqueue time when it moves it
			// to the dead-letter queue: each dead letter is kept the
			// dead-letter queue's retention from then.
			add(Finding{ID: "sqs.dlq-retention", Severity: OK, Summary: "dead letters are kept the dead-letter queue's retention from when they are moved (FIFO: SQS resets their enqueue time)",
				Evidence: fmt.Sprintf("%s MessageRetentionPeriod %s, %s's %s; FIFO queues", dlqName, dst, q, src)})
		case dst < src:
			add(Finding{ID: "sqs.dlq-retention", Severity: Error, Summary: "the dead-letter queue keeps messages for less time than the queue: SQS keeps a message's original enqueue time, so dead letters expire early",
				Evidence: fmt.Sprintf("%s MessageRetentionPeriod %s < %s's %s", dlqName, dst, q, src),
				Fix:      fmt.Sprintf("set %s's MessageRetentionPeriod to at least %d seconds (14 days, 1209600, is the maximum)", dlqName, int(src.Seconds()))})
		default:
			add(Finding{ID: "sqs.dlq-retention", Severity: OK, Summary: "dead letters are kept at least as long as the queue's messages",
				Evidence: fmt.Sprintf("%s %s ≥ %s %s", dlqName, dst, q, src)})
		}
	}
	return fs, nil
}

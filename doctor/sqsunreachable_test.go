package doctor_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/doctor"
	"github.com/berthq/berth/ledger"
)

// sqsAt returns an SQS broker on endpoint, closed when the test ends.
func sqsAt(t *testing.T, endpoint string) *sqs.Broker {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:   &http.Client{Transport: tr},
	})
	sb, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close() })
	return sb
}

// closedAddr returns 127.0.0.1:PORT where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestSQSUnreachable: an SQS endpoint with nothing listening, or that
// refused doctor's credentials, failed Run at the first queue's check with
// a bare error (berth doctor exited without a finding, and the ledger's
// checks beside it were lost), where RabbitMQ and PostgreSQL give the error
// finding doctor.broker-unreachable: SQS opens without a request. The
// first queue's requests now tell: doctor.broker-unreachable, with the error as evidence and the fix
// that fits, no check of the queues or of the Workers' options, and the
// checks of the stores beside it.
func TestSQSUnreachable(t *testing.T) {
	jobs := []ledger.Job{{MessageID: "1", Status: ledger.StatusSucceeded, Duration: time.Second}}
	opts := doctor.Options{Queues: []string{"billing", "emails"}, Ledger: pagedReader{jobs: jobs}, CheckTimeout: 5 * time.Second}

	// Credentials refused, as SQS answers an unknown access key.
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("x-amzn-query-error", "InvalidClientTokenId;Sender")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"__type":"com.amazon.coral.service#UnrecognizedClientException","message":"The security token included in the request is invalid."}`)
	}))
	defer refusing.Close()

	for _, c := range []struct {
		name, endpoint, summary, evidence, fix string
	}{
		{"refused", "http://" + closedAddr(t), "refused the connection", "connection refused", "is running"},
		{"unknown host", "http://berth-no-such-host.invalid:4566", "host name did not resolve", "berth-no-such-host.invalid", "host name"},
		{"credentials", refusing.URL, "refused the credentials", "InvalidClientTokenId", "credentials"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sb := sqsAt(t, c.endpoint)
			fs, err := doctor.Run(testCtx(t), sb, opts)
			if err != nil {
				t.Fatalf("Run on an unreachable SQS endpoint: %v, want a finding", err)
			}
			expect(t, fs, "doctor.broker-unreachable", "", doctor.Error)
			for _, f := range find(fs, "doctor.broker-unreachable", "") {
				if !strings.Contains(f.Summary, c.summary) || !strings.Contains(f.Evidence, c.evidence) || !strings.Contains(f.Fix, c.fix) {
					t.Errorf("doctor.broker-unreachable: %+v, want %q in the summary, %q in the evidence, %q in the fix", f, c.summary, c.evidence, c.fix)
				}
			}
			for _, f := range fs {
				if strings.HasPrefix(f.ID, "sqs.") || strings.HasPrefix(f.ID, "worker.") || f.ID == "doctor.check-timeout" {
					t.Errorf("a check of the broker or of the Worker's options ran on an unreachable endpoint: %+v", f)
				}
			}
			expect(t, fs, "ledger.duration", "", doctor.OK) // the stores' checks ran beside it

			// SQS, the broker's checks alone, reports it too.
			fs, err = doctor.SQS(testCtx(t), sb, opts)
			if err != nil || len(fs) != 1 || fs[0].ID != "doctor.broker-unreachable" {
				t.Errorf("SQS on an unreachable endpoint: %s, %v", ids(fs), err)
			}
		})
	}

}

// TestSQSNoCredentials: a client whose credential chain finds none (no
// environment variables, no profile, no instance role) sends no request:
// the checks of the first queue failed signing it, and Run returned that
// bare error (berth doctor exited without a finding, the stores' checks
// lost). It is doctor.broker-unreachable, with the chain's error as evidence
// and a fix that says where credentials come from.
func TestSQSNoCredentials(t *testing.T) {
	jobs := []ledger.Job{{MessageID: "1", Status: ledger.StatusSucceeded, Duration: time.Second}}
	opts := doctor.Options{Queues: []string{"billing"}, Ledger: pagedReader{jobs: jobs}, CheckTimeout: 5 * time.Second}
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, "unexpected", http.StatusInternalServerError)
	}))
	defer srv.Close()
	client := awssqs.New(awssqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials: aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{}, errors.New("no EC2 IMDS role found")
		})),
	})
	sb, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close() })

	fs, err := doctor.Run(testCtx(t), sb, opts)
	if err != nil {
		t.Fatalf("Run without AWS credentials: %v, want a finding", err)
	}
	expect(t, fs, "doctor.broker-unreachable", "", doctor.Error)
	for _, f := range find(fs, "doctor.broker-unreachable", "") {
		if !strings.Contains(f.Summary, "credentials") || !strings.Contains(f.Evidence, "no EC2 IMDS role found") ||
			!strings.Contains(f.Fix, "AWS_ACCESS_KEY_ID") {
			t.Errorf("doctor.broker-unreachable: %+v, want the credentials named in the summary, the chain's error as evidence, where credentials come from in the fix", f)
		}
	}
	expect(t, fs, "ledger.duration", "", doctor.OK)
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests reached the endpoint without credentials", n)
	}
}

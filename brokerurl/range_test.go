package brokerurl_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthq/berth/brokerurl"
)

// A value that parses but that the broker cannot use (out of its range, or
// a name with characters it refuses) is a *ParamError naming the parameter
// and wrapping ErrInvalidURL, as the package promises, found before
// anything connects: not the broker's own options error, which the berth
// command reports as a failure to reach the broker rather than a usage
// error. The hosts are unreachable on purpose.
func TestUnusableValuesAreParamErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cases := []struct{ url, param string }{
		{"amqp://admin:pw@127.0.0.1:1/?heartbeat=500ms", "heartbeat"},
		{"amqp://admin:pw@127.0.0.1:1/?prefetch=70000", "prefetch"},
		{"postgres://admin:pw@127.0.0.1:1/db?lease=500us&connect_timeout=2", "lease"},
		{"postgres://admin:pw@127.0.0.1:1/db?max_attempts=2147483648&connect_timeout=2", "max_attempts"},
		{"postgres://admin:pw@127.0.0.1:1/db?max_attempts=-1&connect_timeout=2", "max_attempts"},
		{"nats://127.0.0.1:1?ack_wait=50ms", "ack_wait"},
		{"nats://127.0.0.1:1?prefix=a.b", "prefix"},
		{"http://127.0.0.1:1?visibility_timeout=13h", "visibility_timeout"},
		{"http://127.0.0.1:1?wait_time=21s", "wait_time"},
		{"http://127.0.0.1:1?max_receive_count=1001", "max_receive_count"},
		{"sqs://eu-west-1?dlq_suffix=.dead", "dlq_suffix"},
		// The SDK refuses such a region only at the first request.
		{"sqs://?region=eu-west-1/x", "region"},
		{"http://127.0.0.1:1?region=eu%20west", "region"},
	}
	for _, c := range cases {
		wantParamError(t, ctx, c.url, c.param)
	}
	// An sqs:// host that is no region (a port, a domain) is refused at
	// Open, not at the first request.
	for _, raw := range []string{"sqs://eu-west-1:443", "sqs://sqs.eu-west-1.amazonaws.com"} {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if b != nil {
			b.Close()
		}
		if !errors.Is(err, brokerurl.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", raw, err)
		}
	}
	// The bounds themselves are accepted (no ParamError; the host is
	// unreachable, or nothing connects yet).
	for _, raw := range []string{
		"amqp://admin:pw@127.0.0.1:1/?heartbeat=1s&prefetch=65535",
		"http://127.0.0.1:1?visibility_timeout=12h&wait_time=20s&max_receive_count=1000&dlq_suffix=-dead_1",
	} {
		short, cancel := context.WithTimeout(ctx, time.Second) // connecting would fail anyway
		b, err := brokerurl.Open(short, raw, brokerurl.Options{})
		cancel()
		if b != nil {
			b.Close()
		}
		var pe *brokerurl.ParamError
		if errors.As(err, &pe) {
			t.Errorf("Open(%q) = %v, want the bounds accepted", raw, err)
		}
	}
}

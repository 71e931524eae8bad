package brokerurl_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokerurl"
)

// A part of the URL that the scheme's opener does not use is refused with
// ErrInvalidURL saying which, before anything connects. Before,
// sqs://eu-west-1/some/path opened a broker for eu-west-1 and dropped the
// path (the user believed the queue was named there); the same went for a
// nats:// path, a mem:// host, path or user info, and any fragment. The
// hosts are unreachable on purpose: a URL that got past the check fails
// otherwise (a connection error, not ErrInvalidURL) or opens.
func TestUnusedURLPartsAreRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cases := []struct{ url, part string }{
		{"sqs://eu-west-1/some/path", "path"},
		{"sqs://eu-west-1/jobs?wait_time=1s", "path"},
		{"sqs:///eu-west-1", "path"},
		{"sqs://eu-west-1#jobs", "fragment"},
		{"http://127.0.0.1:1/#jobs", "fragment"},
		{"mem://jobs", "host"},
		{"mem:///jobs", "path"},
		{"mem://admin:" + secret + "@", "user info"},
		{"mem://#x", "fragment"},
		{"nats://admin:" + secret + "@127.0.0.1:1/jobs", "path"},
		{"nats://127.0.0.1:1#jobs", "fragment"},
		{"amqp://admin:" + secret + "@127.0.0.1:1/vhost#jobs", "fragment"},
		{"postgres://admin:" + secret + "@127.0.0.1:1/db?connect_timeout=2#jobs", "fragment"},
	}
	for _, c := range cases {
		b, err := brokerurl.Open(ctx, c.url, brokerurl.Options{})
		if b != nil {
			b.Close()
		}
		var pe *brokerurl.ParamError
		if !errors.Is(err, brokerurl.ErrInvalidURL) || errors.As(err, &pe) || !strings.Contains(err.Error(), c.part) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL naming the unused %s", c.url, err, c.part)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q): the error shows the secret: %v", c.url, err)
		}
	}
	// The documented forms, and a lone "/" path, still open (or fail
	// connecting, not with ErrInvalidURL).
	for _, raw := range []string{
		"sqs://eu-west-1", "sqs://eu-west-1/", "sqs://?region=eu-west-1",
		"http://127.0.0.1:1", "http://127.0.0.1:1/", "http://127.0.0.1:1/prefix?wait_time=1s",
		"mem://", "mem:", "mem:?lease=1s", "mem:///",
	} {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if err != nil {
			t.Errorf("Open(%q) = %v, want a broker", raw, err)
			continue
		}
		b.Close()
	}
	for _, raw := range []string{
		"amqp://admin:pw@127.0.0.1:1/vhost",
		"postgres://admin:pw@127.0.0.1:1/db?connect_timeout=1",
		"nats://admin:pw@127.0.0.1:1",
		"nats://127.0.0.1:1/",
	} {
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		b, err := brokerurl.Open(short, raw, brokerurl.Options{})
		cancel()
		if b != nil {
			b.Close()
		}
		if errors.Is(err, brokerurl.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want the URL accepted (a connection error)", raw, err)
		}
	}
}

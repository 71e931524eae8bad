package brokerurl_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/sdk"
)

// A password with characters a URL must escape ('@', '/', ':', '%', ' ')
// is written in the URL percent-encoded. An opener that quotes its URL, or a
// DSN it built from it, shows the password in an encoded form: Open's
// scrubbing must hide it in those forms too, not only decoded.
func TestScrubHidesAPercentEncodedPassword(t *testing.T) {
	errUnreachable := errors.New("unreachable")
	quotes := map[string]func(u *url.URL, raw string) string{
		"the URL":        func(u *url.URL, _ string) string { return u.String() },
		"a query escape": func(u *url.URL, _ string) string { p, _ := u.User.Password(); return "password=" + url.QueryEscape(p) },
		"a path escape":  func(u *url.URL, _ string) string { p, _ := u.User.Password(); return "/" + url.PathEscape(p) },
		"as written":     func(_ *url.URL, raw string) string { return raw },
	}
	for _, raw := range []string{
		"leaky://admin:s3cr%40t%2Fpa%3Ass%2520%20w@127.0.0.1:1/v",
		// Escaped as url.URL.String would not: 'a' as %61.
		"leaky://admin:s3cr%40t%2Fp%61%3Ass%2520%20w@127.0.0.1:1/v",
	} {
		written := strings.TrimPrefix(raw[:strings.LastIndex(raw, "@")], "leaky://admin:")
		for name, quote := range quotes {
			leaky := func(_ context.Context, u *url.URL, p *brokerurl.Params) (sdk.Broker, error) {
				if err := p.Done(); err != nil {
					return nil, err
				}
				return nil, fmt.Errorf("cannot reach %s: %w", quote(u, raw), errUnreachable)
			}
			_, err := brokerurl.Open(context.Background(), raw, brokerurl.Options{Schemes: map[string]brokerurl.Opener{"leaky": leaky}})
			if !errors.Is(err, errUnreachable) {
				t.Fatalf("%s: Open = %v, want the opener's error", name, err)
			}
			msg := err.Error()
			const pw = "s3cr@t/pa:ss%20 w"
			for _, form := range []string{pw, written, url.QueryEscape(pw), url.PathEscape(pw), url.UserPassword("admin", pw).String()} {
				if strings.Contains(msg, form) {
					t.Errorf("%s quoted in the error of %s: the password shows as %q: %s", name, raw, form, msg)
				}
			}
			if !strings.Contains(msg, "cannot reach") {
				t.Errorf("%s: the error lost its own text: %s", name, msg)
			}
		}
	}
}

// A URL without "//" after the scheme names no host and no userinfo:
// "amqps:user:pass@host/vhost" parses as an opaque URL, and
// "amqp:/user:pass@host" (one slash) takes the rest as a path. The openers
// then read the scheme's defaults (RabbitMQ's localhost:5672 as guest, asking
// for the vhost "user:pass@host/vh"; SQS's default region): Open connected
// to a broker the URL does not name, or failed with an error that quoted the
// password, which Open could not find to scrub. Such a URL is an
// ErrInvalidURL that does not repeat it; "mem:" and a bare query still open.
func TestURLWithoutAuthorityIsInvalid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var bad []string
	for _, sep := range []string{":", ":/"} {
		bad = append(bad,
			"amqp"+sep+"admin:"+secret+"@127.0.0.1:1/vh",
			"amqps"+sep+"admin:"+secret+"@127.0.0.1:1/vh",
			"nats"+sep+"admin:"+secret+"@127.0.0.1:1",
			"postgres"+sep+"admin:"+secret+"@127.0.0.1:1/db",
			"sqs"+sep+"eu-west-1",
			"mem"+sep+"x",
		)
	}
	bad = append(bad, "http:/127.0.0.1:1")
	for _, raw := range bad {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if b != nil {
			b.Close()
		}
		if !errors.Is(err, brokerurl.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", raw, err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q): the error shows the password: %v", raw, err)
		}
	}
	for _, raw := range []string{"mem:", "mem:?lease=1s", "MEM://", "mem://?lease=1s"} {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if err != nil {
			t.Fatalf("Open(%q) = %v", raw, err)
		}
		b.Close()
	}
}

// A '/' or '?' in a password written without percent-encoding ends the
// authority early: "nats://user:/secret@host" has the host "user:" and the
// path "/secret@host", and no password Open could scrub. The errors quoted
// the rest of the password as the path, a parameter's name, the redacted
// URL or the database. Such a URL (an '@' in the path or in a parameter's
// name) is an ErrInvalidURL that does not repeat it; an encoded '@' (%40)
// and an '@' in a parameter's value still open.
func TestPasswordCutShortByASlashIsInvalid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, raw := range []string{
		"nats://user:/" + secret + "@127.0.0.1:1",
		"nats://user:?" + secret + "@127.0.0.1:1",
		"amqp://guest:/" + secret + "@127.0.0.1:1/",
		"amqp://guest:p@ss/" + secret + "@127.0.0.1:1/vh",
		"postgres://postgres:/" + secret + "@127.0.0.1:1/postgres",
		"sqs://user:?" + secret + "@eu-west-1",
		"http://user:/" + secret + "@127.0.0.1:1",
		"mem://u:/" + secret + "@x",
	} {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if b != nil {
			b.Close()
		}
		if !errors.Is(err, brokerurl.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", raw, err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q): the error shows the password: %v", raw, err)
		}
	}
	for _, raw := range []string{"mem://?lease=1s#", "mem:///%40", "mem://?lease=1s&x=a@b"} {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if b != nil {
			b.Close()
		}
		if err != nil && strings.Contains(err.Error(), "'@' follows the host") {
			t.Errorf("Open(%q) = %v: refused as a password cut short", raw, err)
		}
	}
}

package brokerurl_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokerurl"
)

// nats://TOKEN@host is a token given as the user, a secret as the password
// is. A host holding a list of servers ("a:4222,b:4222", which the doc said
// is not a URL) was passed to nats.go, which splits it and parses each server
// again: one that does not parse gave an error quoting it, token included
// ("parse \"nats://TOKEN@127.0.0.1:x\": invalid port"), and Open, scrubbing
// passwords only, returned it as is. A list is now refused with
// ErrInvalidURL before anything is dialled, without the token.
func TestNATSServerListIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, raw := range []string{
		"nats://" + secret + "@127.0.0.1:x,127.0.0.1:1",
		"nats://" + secret + "@127.0.0.1:1,127.0.0.1:2",
		"nats://admin:" + secret + "@127.0.0.1:x,127.0.0.1:1",
	} {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if b != nil {
			b.Close()
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q): the error shows the token: %v", raw, err)
		}
		if !errors.Is(err, brokerurl.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL (a list of servers)", raw, err)
		}
	}
}

// A password that begins with a '?' written as is ("admin:?Kx9=Zq7") ends
// the authority at once: the URL has no user info, the host "admin:" (an
// empty port) and the query "Kx9=Zq7@host…", whose '@' is in a value, not a
// name, so the check for a password cut short let it through. The error then
// named the parameter "Kx9", a piece of the password, as unknown (on
// postgres:// it went to pgx as a setting, sent to the host "admin"). Such a
// URL is an ErrInvalidURL that repeats no piece of it; a host with a port and
// an '@' in a parameter's value still opens.
func TestPasswordCutShortByAQuestionMarkIsInvalid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const piece = "Kx9"
	for _, raw := range []string{
		"amqp://admin:?" + piece + "=Zq7@127.0.0.1:1/vh",
		"nats://admin:?" + piece + "=Zq7@127.0.0.1:1",
		"postgres://admin:?" + piece + "=Zq7@127.0.0.1:1/db",
		"sqs://admin:?x&" + piece + "=Zq7@eu-west-1",
		"mem://admin:?" + piece + "=Zq7@",
		// A password whose '?' follows digits: the host "admin:12" has a
		// port, not an empty one, and the piece still showed.
		"amqp://admin:12?" + piece + "=Zq7@127.0.0.1:1/vh",
		"nats://admin:12?" + piece + "=Zq7@127.0.0.1:1",
		"postgres://admin:12?" + piece + "=Zq7@127.0.0.1:1/db",
	} {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if b != nil {
			b.Close()
		}
		if !errors.Is(err, brokerurl.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", raw, err)
		}
		if err != nil && strings.Contains(err.Error(), piece) {
			t.Errorf("Open(%q): the error shows a piece of the password: %v", raw, err)
		}
	}
	b, err := brokerurl.Open(ctx, "mem://?lease=1s&x=a@b", brokerurl.Options{})
	if b != nil {
		b.Close()
	}
	if err != nil && strings.Contains(err.Error(), "'@' follows the host") {
		t.Errorf("an '@' in a value refused as a password cut short: %v", err)
	}
}

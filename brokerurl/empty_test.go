package brokerurl_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/integration"
)

// withParam returns raw with the query parameter name=value added.
func withParam(t *testing.T, raw, name, value string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// A parameter given with an empty value ("?schema=", as a shell writes
// "?schema=$SCHEMA" with SCHEMA unset) is refused with a ParamError naming
// it. It was taken as the parameter's default: postgres://…?schema= opened
// the broker on the schema "berth", and a berth command run with it read,
// redrove or purged the dead letters of a schema the URL did not name;
// nats://…?creds= connected without credentials, ?prefix= used the streams
// of the prefix "berth". The servers are real: before, each of these
// opened.
func TestEmptyValueIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg, amqp, nats, sqs := integration.PostgresDSN(t), integration.RabbitMQURL(t), integration.NATSURL(t), integration.SQSEndpoint(t)
	cases := []struct{ url, param string }{
		{withParam(t, pg, "schema", ""), "schema"},
		{withParam(t, amqp, "connection_name", ""), "connection_name"},
		{withParam(t, nats, "prefix", ""), "prefix"},
		{withParam(t, nats, "creds", ""), "creds"},
		{withParam(t, nats, "nkey", ""), "nkey"},
		{withParam(t, nats, "connection_name", ""), "connection_name"},
		{withParam(t, withParam(t, sqs, "region", "us-east-1"), "dlq_suffix", ""), "dlq_suffix"},
		{withParam(t, sqs, "region", ""), "region"},
	}
	for _, c := range cases {
		b, err := brokerurl.Open(ctx, c.url, brokerurl.Options{})
		if b != nil {
			detail := ""
			var pb *postgres.Broker
			if as, ok := b.(interface{ As(any) bool }); ok && as.As(&pb) {
				detail = " on the schema " + pb.Schema()
			}
			_ = b.Close()
			t.Errorf("Open(%q) opened a broker%s, want a ParamError naming %q", c.url, detail, c.param)
			continue
		}
		var pe *brokerurl.ParamError
		if !errors.As(err, &pe) || pe.Param != c.param || !errors.Is(err, brokerurl.ErrInvalidURL) || !strings.Contains(pe.Reason, "empty") {
			t.Errorf("Open(%q) = %v, want a ParamError naming %q as empty", c.url, err, c.param)
		}
	}
	// An empty default (Options.Defaults) is refused as well, when the
	// scheme reads it; the URL's own value still overrides it.
	if b, err := brokerurl.Open(ctx, pg, brokerurl.Options{Defaults: url.Values{"schema": {""}}}); err == nil {
		_ = b.Close()
		t.Error("an empty schema in Options.Defaults opened a broker")
	}
}

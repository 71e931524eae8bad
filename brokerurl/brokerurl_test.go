package brokerurl_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "hunter2"

func TestErrorsNameTheParameterAndHideThePassword(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		url, param string
	}{
		{"amqp://admin:" + secret + "@127.0.0.1:1/?prefetch=lots", "prefetch"},
		{"amqp://admin:" + secret + "@127.0.0.1:1/?queue_type=stream", "queue_type"},
		{"amqps://admin:" + secret + "@127.0.0.1:1/?prefech=3", "prefech"},
		{"postgres://admin:" + secret + "@127.0.0.1:1/db?lease=forever", "lease"},
		{"postgres://admin:" + secret + "@127.0.0.1:1/db?listen=maybe", "listen"},
		{"postgresql://admin:" + secret + "@127.0.0.1:1/db?schema=pg_catalog", "schema"},
		{"postgresql://admin:" + secret + "@127.0.0.1:1/db?schema=x%3Bdrop", "schema"},
		{"mem://?lease=-1s", "lease"},
		{"mem://?max_deliveries=1&max_deliveries=2", "max_deliveries"},
		{"mem://?password=" + secret, "password"},
		{"sqs://eu-west-1?wait_time=" + secret, "wait_time"},
		{"http://127.0.0.1:1?visibility=30s", "visibility"},
	}
	for _, c := range cases {
		err, ok := wantParamError(t, ctx, c.url, c.param)
		if !ok {
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q): the error shows the secret: %v", c.url, err)
		}
	}
}

func TestUnknownSchemeAndUnparsableURL(t *testing.T) {
	ctx := context.Background()
	_, err := brokerurl.Open(ctx, "kafka://admin:"+secret+"@host/", brokerurl.Options{})
	if !errors.Is(err, brokerurl.ErrUnknownScheme) || strings.Contains(err.Error(), secret) {
		t.Errorf("kafka: %v", err)
	}
	for _, raw := range []string{"", "localhost:5432", "postgres://admin:" + secret + "@host:port/db", "amqp://a:" + secret + "@[::1/", "postgres://a:" + secret + "@h/db?schema=x;drop"} {
		_, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q) = %v", raw, err)
		}
		if !errors.Is(err, brokerurl.ErrInvalidURL) && !errors.Is(err, brokerurl.ErrUnknownScheme) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", raw, err)
		}
	}
}

func TestConnectionErrorsHideThePassword(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, raw := range []string{
		"postgres://admin:" + secret + "@127.0.0.1:1/db?connect_timeout=2",
		"amqp://admin:" + secret + "@127.0.0.1:1/",
		"nats://admin:" + secret + "@127.0.0.1:1",
	} {
		b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
		if err == nil {
			b.Close()
			t.Fatalf("Open(%s) connected to port 1", raw)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open: %v", err)
		}
	}
}

func TestMemory(t *testing.T) {
	ctx := context.Background()
	b, err := brokerurl.Open(ctx, "mem://?lease=5s&max_deliveries=3", brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.(*memory.Broker); !ok {
		t.Fatalf("mem:// opened %T", b)
	}
	if err := b.Publish(ctx, "q", &sdk.Message{Type: "t", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
}

func TestMemoryMaxBacklog(t *testing.T) {
	ctx := context.Background()
	if _, err := brokerurl.Open(ctx, "mem://?max_backlog=-1", brokerurl.Options{}); err == nil {
		t.Fatal("mem://?max_backlog=-1 opened")
	}
	b, err := brokerurl.Open(ctx, "mem://?max_backlog=1", brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Publish(ctx, "q", &sdk.Message{Type: "t"}); err != nil {
		t.Fatal(err)
	}
	// The bound holds: a second message waits for a receiver until its
	// context ends, and is not stored.
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := b.Publish(wctx, "q", &sdk.Message{Type: "t"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish past max_backlog=1 = %v, want it to wait until its deadline", err)
	}
	if s, err := b.(sdk.Inspector).Stats(ctx, "q"); err != nil || s.Ready != 1 {
		t.Fatalf("Stats = %+v, %v; want 1 ready", s, err)
	}
}

func TestOptions(t *testing.T) {
	ctx := context.Background()
	var got url.Values
	custom := func(_ context.Context, u *url.URL, p *brokerurl.Params) (sdk.Broker, error) {
		got = url.Values{"depth": {fmt.Sprint(p.Int("depth", 1))}, "name": {p.String("name", "")}}
		if err := p.Done(); err != nil {
			return nil, err
		}
		return memory.New(memory.Options{})
	}
	opts := brokerurl.Options{
		Schemes:  map[string]brokerurl.Opener{"test": custom},
		Defaults: url.Values{"depth": {"7"}, "name": {"x"}},
	}
	b, err := brokerurl.Open(ctx, "test://h?name=y", opts)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if got.Get("depth") != "7" || got.Get("name") != "y" {
		t.Fatalf("params %v: the default and the URL's own value", got)
	}
	// A default the scheme does not know is not an error.
	b, err = brokerurl.Open(ctx, "mem://", brokerurl.Options{Defaults: url.Values{"no_declare": {"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
}

// An opener that forgets Params.Done still has its unknown parameters refused.
func TestOpenerThatForgetsDone(t *testing.T) {
	lazy := func(context.Context, *url.URL, *brokerurl.Params) (sdk.Broker, error) {
		return memory.New(memory.Options{})
	}
	_, err := brokerurl.Open(context.Background(), "lazy://?x=1", brokerurl.Options{Schemes: map[string]brokerurl.Opener{"lazy": lazy}})
	var pe *brokerurl.ParamError
	if !errors.As(err, &pe) || pe.Param != "x" {
		t.Fatalf("%v", err)
	}
}

// An opener that returns neither a broker nor an error gets an error from
// Open, not a nil broker (nor a panic closing it over an unused parameter).
func TestOpenerThatReturnsNothing(t *testing.T) {
	none := func(context.Context, *url.URL, *brokerurl.Params) (sdk.Broker, error) { return nil, nil }
	for _, raw := range []string{"none://", "none://?x=1"} {
		b, err := brokerurl.Open(context.Background(), raw, brokerurl.Options{Schemes: map[string]brokerurl.Opener{"none": none}})
		if err == nil || b != nil {
			t.Fatalf("%s: got broker %v, error %v; want an error", raw, b, err)
		}
	}
}

// A nil opener in Options.Schemes is the caller's mistake: Open says so in
// an error naming the scheme instead of calling it (a nil dereference).
func TestNilOpenerIsAnError(t *testing.T) {
	for _, scheme := range []string{"custom", "mem"} { // a new scheme, a built-in one replaced
		raw := scheme + "://user:" + secret + "@host"
		b, err := brokerurl.Open(context.Background(), raw, brokerurl.Options{Schemes: map[string]brokerurl.Opener{scheme: nil}})
		if err == nil || b != nil {
			t.Fatalf("%s: got broker %v, error %v; want an error", scheme, b, err)
		}
		if !strings.Contains(err.Error(), "nil opener") || !strings.Contains(err.Error(), strconv.Quote(scheme)) || strings.Contains(err.Error(), secret) {
			t.Fatalf("%s: error %q does not name the nil opener and its scheme (or shows the password)", scheme, err)
		}
	}
}

func TestPostgres(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	ctx := context.Background()
	schema := fmt.Sprintf("brokerurl_%d", rand.Uint64()%1e12)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	q.Set("migrate", "true")
	q.Set("lease", "10s")
	q.Set("application_name", "brokerurl-test") // a pgx parameter, passed through
	u.RawQuery = q.Encode()
	b, err := brokerurl.Open(ctx, u.String(), brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var pb *postgres.Broker
	if as, ok := b.(interface{ As(any) bool }); !ok || !as.As(&pb) || pb.Schema() != schema {
		t.Fatalf("As(*postgres.Broker) of %T", b)
	}
	t.Cleanup(func() {
		b.Close()
		if conn, err := pgx.Connect(context.Background(), dsn); err == nil {
			_, _ = conn.Exec(context.Background(), `DROP SCHEMA "`+schema+`" CASCADE`)
			_ = conn.Close(context.Background())
		}
	})
	if err := b.Publish(ctx, "q", &sdk.Message{Type: "t", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	st, err := b.(sdk.Inspector).Stats(ctx, "q")
	if err != nil || st.Ready != 1 {
		t.Fatalf("stats %+v %v", st, err)
	}
}

func TestRabbitMQ(t *testing.T) {
	raw := integration.RabbitMQURL(t)
	b, err := brokerurl.Open(context.Background(), raw+"?prefetch=8&queue_type=classic&no_declare=true&connection_name=brokerurl-test"+
		"&ack_interval=5ms&sync_ack=true&move_delays=false", brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	for _, bad := range []string{"ack_interval=soon", "sync_ack=maybe", "move_delays_up_to=-1m", "move_delays=no-thanks",
		"move_delays_up_to=1m&move_delays=false"} { // the second would silently drop the first
		var pe *brokerurl.ParamError
		if _, err := brokerurl.Open(context.Background(), raw+"?"+bad, brokerurl.Options{}); !errors.Is(err, brokerurl.ErrInvalidURL) || !errors.As(err, &pe) {
			t.Errorf("%s: %v, want a *ParamError wrapping ErrInvalidURL", bad, err)
		}
	}
}

func TestSQS(t *testing.T) {
	endpoint := integration.SQSEndpoint(t)
	b, err := brokerurl.Open(context.Background(), endpoint+"?region=eu-west-1&wait_time=1s", brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
}

// An emulator on "LOCALHOST" is on loopback too (host names are
// case-insensitive): it gets the static dummy credentials, not the AWS
// default chain, which has nothing to give here.
func TestSQSLoopbackHostCase(t *testing.T) {
	endpoint := integration.SQSEndpoint(t)
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = "LOCALHOST:" + u.Port()
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := brokerurl.Open(ctx, u.String()+"?region=us-east-1", brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sb, ok := b.(*sqs.Broker)
	if !ok {
		t.Fatalf("%s opened %T", u.Host, b)
	}
	creds, err := sb.Client().Options().Credentials.Retrieve(ctx)
	if err != nil || creds.AccessKeyID != "berth" {
		t.Fatalf("credentials through %s: %q, %v; want the static dummy ones", u.Host, creds.AccessKeyID, err)
	}
}

// TestSQSRegionLowerCase: a region in upper case (sqs://EU-WEST-1: a URL's
// host is case-insensitive; sqs://?region=AP-South-1) reaches the SQS client in
// lower case. It was passed on as written, and the signer put it so in the
// signature's scope, which AWS refuses.
func TestSQSRegionLowerCase(t *testing.T) {
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	for raw, want := range map[string]string{
		"sqs://EU-WEST-1":                        "eu-west-1",
		"sqs://?region=AP-South-1":               "ap-south-1",
		"https://SQS.US-EAST-2.AMAZONAWS.COM":    "us-east-2",
		"http://127.0.0.1:4566?region=EU-WEST-3": "eu-west-3",
	} {
		b, err := brokerurl.Open(context.Background(), raw, brokerurl.Options{})
		if err != nil {
			t.Errorf("Open(%s): %v", raw, err)
			continue
		}
		sb, ok := b.(*sqs.Broker)
		if !ok {
			t.Errorf("%s opened %T", raw, b)
		} else if got := sb.Client().Options().Region; got != want {
			t.Errorf("Open(%s): region %q, want %q", raw, got, want)
		}
		_ = b.Close()
	}
}

func TestJetStream(t *testing.T) {
	raw := integration.NATSURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := brokerurl.Open(ctx, raw+"?ack_wait=soon", brokerurl.Options{}); !errors.Is(err, brokerurl.ErrInvalidURL) {
		t.Fatalf("ack_wait=soon: %v, want ErrInvalidURL", err)
	}
	b, err := brokerurl.Open(ctx, raw+"?ack_wait=5s&wait_time=1s&max_deliveries=4&connection_name=brokerurl-test", brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	js, ok := b.(*jetstream.Broker)
	if !ok {
		t.Fatalf("nats:// opened %T", b)
	}
	if o := js.Options(); o.AckWait != 5*time.Second || o.WaitTime != time.Second || o.MaxDeliveries != 4 {
		t.Errorf("options %+v: the URL's parameters not applied", o)
	}
	q := "brokerurl_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer func() { _ = js.DeleteQueue(context.Background(), q) }()
	if err := b.Publish(ctx, q, &sdk.Message{Type: "t", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1)
	if err != nil || len(ds) != 1 || string(ds[0].Message().Body) != "x" {
		t.Fatalf("Receive: %d deliveries, %v", len(ds), err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	// The CLI's defaults: no_declare makes a missing queue ErrNotFound.
	nd, err := brokerurl.Open(ctx, raw, brokerurl.Options{Defaults: url.Values{"no_declare": {"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	if err := nd.Publish(ctx, q+"_missing", &sdk.Message{Type: "t"}); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Publish to a missing queue with no_declare: %v, want ErrNotFound", err)
	}
}

// wantParamError opens raw (closing any broker it gets) and reports, as a
// test error, an outcome other than a *ParamError naming param and wrapping
// ErrInvalidURL. It returns Open's error and whether it was that.
func wantParamError(t *testing.T, ctx context.Context, raw, param string) (error, bool) {
	t.Helper()
	b, err := brokerurl.Open(ctx, raw, brokerurl.Options{})
	if b != nil {
		b.Close()
	}
	var pe *brokerurl.ParamError
	if !errors.As(err, &pe) || pe.Param != param || !errors.Is(err, brokerurl.ErrInvalidURL) {
		t.Errorf("Open(%q) = %v, want a ParamError naming %q", raw, err, param)
		return err, false
	}
	return err, true
}

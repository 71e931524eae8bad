package brokerurl

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// schemes is the one table of built-in schemes. To add a broker, add its
// schemes here and write its Opener below (or in a file of its own).
var schemes = map[string]Opener{
	"amqp":       openRabbitMQ,
	"amqps":      openRabbitMQ,
	"postgres":   openPostgres,
	"postgresql": openPostgres,
	"sqs":        openSQS,
	"http":       openSQS,
	"https":      openSQS,
	"mem":        openMemory,
	"nats":       openJetStream,
}

// openJetStream opens NATS JetStream: nats://user:pass@host:4222 (one
// server: a list, nats://a:4222,b:4222, is refused with [ErrInvalidURL];
// nats.go learns the others from the cluster). No path.
//
// Parameters (the fields of [jetstream.Options] and [jetstream.ConnectOptions]):
// ack_wait (duration, at least 100ms), wait_time (duration),
// max_deliveries, max_message_size, prefix (letters, digits, '-' and '_'),
// no_declare, async_ack, connection_name, creds (a .creds file),
// nkey (an NKey seed file), tls (true: require TLS, verified against the
// system roots).
func openJetStream(ctx context.Context, u *url.URL, p *Params) (sdk.Broker, error) {
	o := jetstream.Options{
		AckWait:        p.Duration("ack_wait", 0),
		WaitTime:       p.Duration("wait_time", 0),
		MaxDeliveries:  p.Int("max_deliveries", 0),
		MaxMessageSize: p.Int("max_message_size", 0),
		Prefix:         p.name("prefix", ""),
		NoDeclare:      p.Bool("no_declare", false),
		AsyncAck:       p.Bool("async_ack", false),
	}
	co := jetstream.ConnectOptions{
		Name:            p.name("connection_name", ""),
		CredentialsFile: p.name("creds", ""),
		NKeyFile:        p.name("nkey", ""),
	}
	if p.Bool("tls", false) {
		co.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	p.check("ack_wait", o.AckWait == 0 || o.AckWait >= 100*time.Millisecond, "want a duration of at least 100ms")
	p.check("prefix", plainName(o.Prefix), "want only letters, digits, '-' and '_'")
	if err := p.Done(); err != nil {
		return nil, err
	}
	if err := unusedParts(p.scheme, u, usesUser|usesHost); err != nil {
		return nil, err
	}
	if strings.Contains(u.Host, ",") {
		// nats.go splits a server list at its commas and parses each
		// server again: the error of one that does not parse quotes it,
		// with a token given as the user (which Open does not scrub).
		return nil, fmt.Errorf("%w: nats: the host is a list of servers: give one (nats.go learns the cluster's others from it)", ErrInvalidURL)
	}
	return jetstream.Connect(ctx, withQuery(u, nil), co, o)
}

// openMemory opens a new, empty memory broker: mem:// (no host, user info
// or path).
//
// Parameters: lease (duration), max_deliveries, max_message_size,
// max_backlog — the fields of [memory.Options], with their meanings:
// max_deliveries and max_message_size take a negative integer for "no
// limit", as those fields do.
func openMemory(_ context.Context, u *url.URL, p *Params) (sdk.Broker, error) {
	o := memory.Options{
		Lease:          p.Duration("lease", 0),
		MaxDeliveries:  p.signedInt("max_deliveries", 0),
		MaxMessageSize: p.signedInt("max_message_size", 0),
		MaxBacklog:     p.Int("max_backlog", 0),
	}
	if err := p.Done(); err != nil {
		return nil, err
	}
	if err := unusedParts(p.scheme, u, 0); err != nil {
		return nil, err
	}
	return memory.New(o)
}

// openRabbitMQ opens RabbitMQ: amqp://user:pass@host:5672/vhost or amqps://.
//
// Parameters (the fields of [rabbitmq.Options]): prefetch (at most 65535),
// queue_type (quorum or classic), max_deliveries, no_declare (true: never
// declare topology), connection_name, heartbeat (duration, at least 1s:
// AMQP counts whole seconds), ack_interval (duration), sync_ack,
// move_delays_up_to (duration; the longest delay bucket the consuming
// process moves back itself) and move_delays (false: every delay is left to
// the server's dead-lettering; refused beside move_delays_up_to).
func openRabbitMQ(ctx context.Context, u *url.URL, p *Params) (sdk.Broker, error) {
	o := rabbitmq.Options{
		Prefetch:       p.Int("prefetch", 0),
		QueueType:      rabbitmq.QueueType(p.Enum("queue_type", "", string(rabbitmq.Quorum), string(rabbitmq.Classic))),
		MaxDeliveries:  p.Int("max_deliveries", 0),
		NoDeclare:      p.Bool("no_declare", false),
		ConnectionName: p.name("connection_name", ""),
		Heartbeat:      p.Duration("heartbeat", 0),
		AckInterval:    p.Duration("ack_interval", 0),
		SyncAck:        p.Bool("sync_ack", false),
		MoveDelaysUpTo: p.Duration("move_delays_up_to", 0),
	}
	if !p.Bool("move_delays", true) {
		// move_delays=false leaves every delay to the server: a bucket
		// limit beside it would be ignored, so it is refused, not dropped.
		p.check("move_delays", o.MoveDelaysUpTo == 0, "false leaves every delay to the server: drop move_delays_up_to or move_delays")
		o.MoveDelaysUpTo = -1
	}
	p.check("prefetch", o.Prefetch <= 65535, "want an integer from 0 to 65535")
	p.check("heartbeat", o.Heartbeat == 0 || o.Heartbeat >= time.Second, "want a duration of at least 1s (AMQP counts whole seconds)")
	if err := p.Done(); err != nil {
		return nil, err
	}
	if err := unusedParts(p.scheme, u, usesUser|usesHost|usesPath); err != nil {
		return nil, err
	}
	cctx, finish := p.connectWithin(ctx)
	b, err := rabbitmq.New(cctx, withQuery(u, nil), o)
	if err = finish(err); err != nil {
		return nil, err
	}
	return b, nil
}

// openPostgres opens the PostgreSQL job table: postgres://user:pass@host/db.
//
// Parameters: schema, lease (duration, at least 1ms), max_attempts (0, the
// default, to 2147483647: the column is a PostgreSQL integer),
// poll_interval (duration), listen (default true; false for poolers in
// transaction mode), dedupe_enqueue, migrate (true: create or upgrade the
// table on open). Every other parameter (sslmode, application_name, …) goes
// to pgx, except a name with a dot ("foo.bar"), which is refused: pgx sends
// an unknown name to the server as a setting, and PostgreSQL takes a dotted
// one as a custom setting without checking it (where it refuses an unknown
// plain name), so a misspelt parameter would be accepted silently. Set such
// a setting on purpose with options ("options=-c foo.bar=1"). A parameter
// given more than once is refused, and so is one whose value pgx refuses
// (sslmode=required, a sslrootcert file it cannot read): a [*ParamError]
// naming it, not repeating its value. The broker owns the pool it opens and
// closes it.
func openPostgres(ctx context.Context, u *url.URL, p *Params) (sdk.Broker, error) {
	o := postgres.Options{
		Schema:        p.name("schema", ""),
		Lease:         p.Duration("lease", 0),
		MaxAttempts:   p.Int("max_attempts", 0),
		PollInterval:  p.Duration("poll_interval", 0),
		DisableListen: !p.Bool("listen", true),
		DedupeEnqueue: p.Bool("dedupe_enqueue", false),
	}
	migrate := p.Bool("migrate", false)
	p.check("lease", o.Lease == 0 || o.Lease >= time.Millisecond, "want a duration of at least 1ms")
	p.check("max_attempts", o.MaxAttempts >= 0 && o.MaxAttempts <= math.MaxInt32, "want an integer from 0 (the default) to 2147483647")
	rest := p.Rest()
	for _, k := range slices.Sorted(maps.Keys(rest)) {
		p.check(k, !strings.Contains(k, "."), "unknown parameter (PostgreSQL would take a dotted name as a custom setting, unchecked; to set one on purpose, use options=-c name=value)")
	}
	if err := p.Done(); err != nil {
		return nil, err
	}
	if err := unusedParts(p.scheme, u, usesUser|usesHost|usesPath); err != nil {
		return nil, err
	}
	if o.Schema != "" {
		if err := postgres.ValidateSchema(o.Schema); err != nil {
			return nil, &ParamError{Scheme: "postgres", Param: "schema", Reason: "not a valid schema name"}
		}
	}
	cfg, err := pgxpool.ParseConfig(withQuery(u, rest))
	if err != nil {
		// pgx's error quotes the connection string: it is not passed
		// on. The parameter pgx refuses is named instead, found as the
		// one without which the string parses.
		for _, k := range slices.Sorted(maps.Keys(rest)) {
			without := maps.Clone(rest)
			delete(without, k)
			if _, err := pgxpool.ParseConfig(withQuery(u, without)); err == nil {
				return nil, &ParamError{Scheme: p.scheme, Param: k,
					Reason: "pgx refuses its value (one pgx does not know, or a file it cannot read)"}
			}
		}
		return nil, fmt.Errorf("%w: postgres: the connection string does not parse", ErrInvalidURL)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("brokerurl: postgres: %w", err)
	}
	pctx, finish := ctx, func(err error) error { return err }
	if cfg.ConnConfig.ConnectTimeout == 0 { // else the URL's connect_timeout bounds it (pgx)
		pctx, finish = p.connectWithin(ctx)
	}
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		if bounded := finish(err); bounded != err {
			return nil, bounded
		}
		// pgx names host, user and database, never the password.
		return nil, fmt.Errorf("brokerurl: postgres: cannot connect: %w", err)
	}
	_ = finish(nil)
	b, err := postgres.New(pool, o)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if migrate {
		if err := b.Migrate(ctx); err != nil {
			_ = b.Close()
			pool.Close()
			return nil, err
		}
	}
	return &pgBroker{Broker: b, pool: pool}, nil
}

// pgBroker closes the pool it opened after the broker.
type pgBroker struct {
	*postgres.Broker
	pool *pgxpool.Pool
}

// Close closes the broker, then its pool.
func (b *pgBroker) Close() error {
	err := b.Broker.Close()
	b.pool.Close()
	return err
}

// Unwrap returns the *postgres.Broker under the pool's owner: a wrapper
// that publishes through it, as telemetry looks through one to name the
// messaging system ("postgres", not this package's name).
func (b *pgBroker) Unwrap() sdk.Publisher { return b.Broker }

// As reaches the *postgres.Broker under the pool's owner, or its pool:
// target must be a **postgres.Broker or a **pgxpool.Pool.
func (b *pgBroker) As(target any) bool {
	switch t := target.(type) {
	case **postgres.Broker:
		*t = b.Broker
		return true
	case **pgxpool.Pool:
		*t = b.pool
		return true
	}
	return false
}

// openSQS opens AWS SQS: sqs://REGION (AWS's endpoint of that region; no
// path: queues are not named in the URL) or http(s)://ENDPOINT[/PATH] (an
// emulator such as fauxqs, or a VPC endpoint; a path prefixes every
// request's). Neither takes user info.
//
// Parameters: region (an AWS region such as eu-west-1, in any case; default:
// sqs://'s host, which must be a region too, or the region an AWS endpoint's
// host names (https://sqs.eu-west-1.amazonaws.com), else the AWS
// configuration, else us-east-1; the region is used in lower case; a
// region that contradicts the one the host names, such as
// sqs://eu-west-1?region=us-east-1, is a [*ParamError] naming both),
// visibility_timeout (duration, at most 12h), wait_time (duration, at most
// 20s), max_receive_count (at most 1000), dlq_suffix (letters, digits, '-'
// and '_'). Credentials come from the AWS default chain;
// for an endpoint on a loopback address (an emulator) static dummy
// credentials are used.
func openSQS(ctx context.Context, u *url.URL, p *Params) (sdk.Broker, error) {
	scheme := p.scheme
	region := p.name("region", "")
	o := sqs.Options{
		VisibilityTimeout: p.Duration("visibility_timeout", 0),
		WaitTime:          p.Duration("wait_time", 0),
		MaxReceiveCount:   p.Int("max_receive_count", 0),
		DeadLetterSuffix:  p.name("dlq_suffix", ""),
	}
	p.check("visibility_timeout", o.VisibilityTimeout <= sqs.MaxVisibility, "want a duration of at most "+sqs.MaxVisibility.String())
	p.check("wait_time", o.WaitTime <= sqs.MaxWaitTime, "want a duration of at most "+sqs.MaxWaitTime.String())
	p.check("max_receive_count", o.MaxReceiveCount <= 1000, "want an integer from 0 (the default) to 1000")
	p.check("dlq_suffix", plainName(o.DeadLetterSuffix), "want only letters, digits, '-' and '_'")
	p.check("region", region == "" || awsRegion(region), "want an AWS region such as eu-west-1")
	if err := p.Done(); err != nil {
		return nil, err
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: sqs: credentials in the URL are not supported (use the AWS configuration)", ErrInvalidURL)
	}
	uses := usesHost | usesPath // an http(s) endpoint's path prefixes every request's
	if scheme == "sqs" {
		uses = usesHost
	}
	if err := unusedParts(scheme, u, uses); err != nil {
		return nil, err
	}
	var endpoint, hostRegion string
	if scheme == "sqs" {
		if u.Host != "" && !awsRegion(u.Host) {
			return nil, fmt.Errorf("%w: sqs: the host of an sqs:// URL is an AWS region, e.g. sqs://eu-west-1 (no port)", ErrInvalidURL)
		}
		hostRegion = u.Host
	} else {
		if u.Host == "" {
			return nil, fmt.Errorf("%w: sqs: an http(s) URL must name the endpoint's host", ErrInvalidURL)
		}
		endpoint = withQuery(u, nil)
		// An AWS endpoint names its region; requests signed for
		// another (the configuration's, us-east-1) are refused.
		hostRegion = endpointRegion(u.Hostname())
	}
	switch {
	case region == "":
		region = hostRegion
	case hostRegion != "" && !strings.EqualFold(region, hostRegion):
		// Which one was meant is not known: ?region= would sign the
		// requests for a region whose endpoint the host is not (AWS
		// refuses them), or send them to another region than the host
		// names. Both are checked region names; quoted all the same.
		return nil, &ParamError{Scheme: scheme, Param: "region",
			Reason: fmt.Sprintf("names the region %s but the URL's host names %s: give one region (drop ?region=, or make them agree)",
				strconv.Quote(strings.ToLower(region)), strconv.Quote(strings.ToLower(hostRegion)))}
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("brokerurl: sqs: AWS configuration: %w", err)
	}
	if region != "" {
		// Regions are lower case: the signer puts the region in the
		// signature's scope as it is given, and AWS refuses requests
		// signed for EU-WEST-1 (a URL's host is case-insensitive, and
		// sqs://EU-WEST-1 names eu-west-1).
		cfg.Region = strings.ToLower(region)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	var optFns []func(*awssqs.Options)
	if endpoint != "" {
		if isLoopback(u.Hostname()) {
			cfg.Credentials = credentials.NewStaticCredentialsProvider("berth", "berth", "")
		}
		optFns = append(optFns, func(o *awssqs.Options) { o.BaseEndpoint = aws.String(endpoint) })
	}
	return sqs.NewFromConfig(cfg, o, optFns...)
}

// withQuery returns u as a string with its query replaced by q. A space is
// written %20, not '+': pgx decodes a connection URI as libpq does, where
// '+' is a plus sign ("options=-c x=y" would reach the server as "-c+x=y").
// Encode writes a '+' of a value as %2B, so every '+' it writes is a space.
func withQuery(u *url.URL, q url.Values) string {
	c := *u
	c.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	c.ForceQuery = false
	return c.String()
}

// endpointRegion returns the region an AWS SQS endpoint's host name holds —
// sqs.REGION.amazonaws.com (.amazonaws.com.cn in China), a VPC endpoint's
// vpce-ID.sqs.REGION.vpce.amazonaws.com, the legacy REGION.queue.amazonaws.com
// — or "" for any other host (an emulator, a proxy).
func endpointRegion(host string) string {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if !strings.HasSuffix(host, ".amazonaws.com") && !strings.HasSuffix(host, ".amazonaws.com.cn") {
		return ""
	}
	labels := strings.Split(host, ".")
	for i := 0; i+1 < len(labels); i++ {
		switch {
		case labels[i] == "sqs" && awsRegion(labels[i+1]) && labels[i+1] != "amazonaws":
			return labels[i+1]
		case labels[i+1] == "queue" && awsRegion(labels[i]):
			return labels[i]
		}
	}
	return ""
}

// awsRegion reports whether s can be an AWS region: the SDK puts it in the
// endpoint's host name and refuses, at the first request, anything but one
// label of letters, digits and '-'.
func awsRegion(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") { // host names are case-insensitive
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

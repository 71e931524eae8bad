package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5/pgxpool"
)

// errNoURL is returned when neither -url nor BERTH_URL is set.
var errNoURL = errors.New("no broker URL: give -url or set BERTH_URL")

// target says which broker to open.
type target struct {
	kind   string // rabbitmq, sqs or postgres
	url    string // URL, DSN or endpoint; never printed
	schema string // PostgreSQL broker schema
}

// open connects to the broker t names. Errors never include the URL.
func open(ctx context.Context, t target) (sdk.Broker, error) {
	kind, rawURL := t.kind, t.url
	if rawURL == "" {
		return nil, errNoURL
	}
	switch strings.ToLower(kind) {
	case "rabbitmq", "amqp":
		// The operator's tool never changes topology.
		return rabbitmq.New(ctx, rawURL, rabbitmq.Options{NoDeclare: true, ConnectionName: "berth-cli"})
	case "postgres", "postgresql":
		pool, err := pgxpool.New(ctx, rawURL)
		if err != nil {
			return nil, errors.New("postgres: invalid DSN") // pgx errors may quote the DSN
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			// pgx names host, user and database, never the password.
			return nil, fmt.Errorf("postgres: cannot connect: %w", err)
		}
		b, err := postgres.New(pool, postgres.Options{Schema: t.schema, DisableListen: true})
		if err != nil {
			pool.Close()
			return nil, err
		}
		return &ownedPool{Broker: b, pool: pool}, nil
	case "sqs":
		u, err := url.Parse(rawURL)
		if err != nil || u.Host == "" {
			return nil, errors.New("sqs: -url must be the endpoint, e.g. https://sqs.eu-west-1.amazonaws.com")
		}
		cfg, err := awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("sqs: AWS configuration: %w", err)
		}
		if cfg.Region == "" {
			cfg.Region = "us-east-1"
		}
		if isLoopback(u.Hostname()) { // an emulator: any static credentials
			cfg.Credentials = credentials.NewStaticCredentialsProvider("berth", "berth", "")
		}
		return sqs.NewFromConfig(cfg, sqs.Options{}, func(o *awssqs.Options) { o.BaseEndpoint = aws.String(rawURL) })
	default:
		return nil, fmt.Errorf("unknown broker %q (want rabbitmq, sqs or postgres)", kind)
	}
}

// ownedPool closes the pool it opened after the broker.
type ownedPool struct {
	*postgres.Broker
	pool *pgxpool.Pool
}

func (o *ownedPool) Close() error {
	err := o.Broker.Close()
	o.pool.Close()
	return err
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Package integration hands tests real service endpoints: a RabbitMQ URL, a
// PostgreSQL DSN, a Redis address, an SQS endpoint and a NATS (JetStream) URL.
//
// Each helper looks, in order, at an environment variable, then at the
// service's usual loopback address (probed), then, when the test binary asked
// for containers, at a container. When none of these works the test is
// skipped, except when the CI environment variable is "true": there a
// missing service fails the test, so an integration test can never pass by
// skipping in CI.
//
// Containers are opt-in, so that this package does not bring Docker's client
// into every test binary that only wants a DSN: import package
// integration/containers for its side effect in the tests that want them,
//
//	import _ "github.com/berthq/berth/integration/containers"
//
// or register another way to start one with [UseContainers].
//
//	func TestSomething(t *testing.T) {
//		dsn := integration.PostgresDSN(t)
//		...
//	}
//
// The package also holds berth's cross-package end-to-end and fault tests.
package integration

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Service describes one backing service a test may need.
type service struct {
	name     string
	env      string
	fallback string                       // loopback default
	addr     func(endpoint string) string // host:port to probe
}

// The services, as [ContainerStarter] receives them.
const (
	ServiceRabbitMQ = "RabbitMQ"
	ServicePostgres = "PostgreSQL"
	ServiceRedis    = "Redis"
	ServiceSQS      = "SQS"
	ServiceNATS     = "NATS"
)

// ContainerStarter starts a container running service (one of the Service
// constants) and returns the endpoint the helper for that service returns.
type ContainerStarter func(service string) (endpoint string, err error)

var (
	mu       sync.Mutex
	resolved = map[string]string{}
	failures = map[string]error{}
	starter  ContainerStarter
)

// UseContainers makes the helpers call start for a service that neither its
// environment variable nor its loopback address provides. Package
// integration/containers calls it when imported; call it before the first
// helper (from TestMain or an init function).
func UseContainers(start ContainerStarter) {
	mu.Lock()
	defer mu.Unlock()
	starter = start
}

// RabbitMQURL returns an AMQP URL (BERTH_RABBITMQ_URL, else amqp://guest:guest@127.0.0.1:5672/).
func RabbitMQURL(t testing.TB) string {
	return resolve(t, service{
		name: ServiceRabbitMQ, env: "BERTH_RABBITMQ_URL", fallback: "amqp://guest:guest@127.0.0.1:5672/",
		addr: urlHostPort("5672"),
	})
}

// PostgresDSN returns a PostgreSQL connection string (BERTH_POSTGRES_DSN, else
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable).
func PostgresDSN(t testing.TB) string {
	return resolve(t, service{
		name: ServicePostgres, env: "BERTH_POSTGRES_DSN", fallback: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		addr: urlHostPort("5432"),
	})
}

// RedisAddr returns a Redis host:port (BERTH_REDIS_ADDR, else 127.0.0.1:6379).
func RedisAddr(t testing.TB) string {
	return resolve(t, service{
		name: ServiceRedis, env: "BERTH_REDIS_ADDR", fallback: "127.0.0.1:6379",
		addr: func(s string) string { return s },
	})
}

// SQSEndpoint returns the base URL of an SQS-compatible endpoint
// (BERTH_SQS_ENDPOINT, else http://127.0.0.1:4566, where .ci/start-sqs runs
// the fauxqs emulator). Use region us-east-1 and any static credentials.
func SQSEndpoint(t testing.TB) string {
	return resolve(t, service{
		name: ServiceSQS, env: "BERTH_SQS_ENDPOINT", fallback: "http://127.0.0.1:4566",
		addr: urlHostPort("4566"),
	})
}

// NATSURL returns the URL of a NATS server with JetStream enabled
// (BERTH_NATS_URL, else nats://127.0.0.1:4222, where the machine and
// scripts/services run nats-server -js).
func NATSURL(t testing.TB) string {
	return resolve(t, service{
		name: ServiceNATS, env: "BERTH_NATS_URL", fallback: "nats://127.0.0.1:4222",
		addr: urlHostPort("4222"),
	})
}

// InCI reports whether the tests run in CI (CI=true), where skipping an
// integration test is an error.
func InCI() bool { return os.Getenv("CI") == "true" }

func resolve(t testing.TB, s service) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if ep, ok := resolved[s.name]; ok {
		return ep
	}
	if err, ok := failures[s.name]; ok {
		unavailable(t, s, err)
		return ""
	}
	ep, err := find(s)
	if err != nil {
		failures[s.name] = err
		unavailable(t, s, err)
		return ""
	}
	resolved[s.name] = ep
	return ep
}

func find(s service) (string, error) {
	if v := os.Getenv(s.env); v != "" {
		if err := probe(s.addr(v)); err != nil {
			return "", fmt.Errorf("%s from $%s does not answer: %w", s.name, s.env, err)
		}
		return v, nil
	}
	probeErr := probe(s.addr(s.fallback))
	if probeErr == nil {
		return s.fallback, nil
	}
	if starter == nil {
		return "", fmt.Errorf("%s: $%s unset, %s does not answer (%v), and containers not enabled (import integration/containers)",
			s.name, s.env, s.addr(s.fallback), probeErr)
	}
	ep, dockerErr := starter(s.name)
	if dockerErr == nil {
		return ep, nil
	}
	return "", fmt.Errorf("%s: $%s unset, %s does not answer (%v), and no container (%v)",
		s.name, s.env, s.addr(s.fallback), probeErr, dockerErr)
}

func unavailable(t testing.TB, s service, err error) {
	t.Helper()
	if InCI() {
		t.Fatalf("integration: %v (CI=true: integration tests must not skip)", err)
	}
	t.Skipf("integration: %v", err)
}

func probe(hostport string) error {
	c, err := net.DialTimeout("tcp", hostport, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// urlHostPort returns a function that extracts host:port from a URL, with
// defaultPort when it has none. Credentials never leave this function.
func urlHostPort(defaultPort string) func(string) string {
	return func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return "invalid-url:0"
		}
		if u.Port() == "" {
			return net.JoinHostPort(strings.Trim(u.Hostname(), "[]"), defaultPort)
		}
		return u.Host
	}
}

// Package integration hands tests real service endpoints: a RabbitMQ URL, a
// PostgreSQL DSN, a Redis address, an SQS endpoint and a NATS (JetStream) URL.
//
// Each helper looks, in order, at an environment variable, then at the
// service's usual loopback address (probed), then, when a Docker daemon
// answers, at a container started through dockertest. When none of these
// works the test is skipped, except when the CI environment variable is
// "true": there a missing service fails the test, so an integration test can
// never pass by skipping in CI.
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
	docker   func() (endpoint string, err error)
}

var (
	mu       sync.Mutex
	resolved = map[string]string{}
	failures = map[string]error{}
)

// RabbitMQURL returns an AMQP URL (BERTH_RABBITMQ_URL, else amqp://guest:guest@127.0.0.1:5672/).
func RabbitMQURL(t testing.TB) string {
	return resolve(t, service{
		name: "RabbitMQ", env: "BERTH_RABBITMQ_URL", fallback: "amqp://guest:guest@127.0.0.1:5672/",
		addr: urlHostPort("5672"), docker: dockerRabbitMQ,
	})
}

// PostgresDSN returns a PostgreSQL connection string (BERTH_POSTGRES_DSN, else
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable).
func PostgresDSN(t testing.TB) string {
	return resolve(t, service{
		name: "PostgreSQL", env: "BERTH_POSTGRES_DSN", fallback: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		addr: urlHostPort("5432"), docker: dockerPostgres,
	})
}

// RedisAddr returns a Redis host:port (BERTH_REDIS_ADDR, else 127.0.0.1:6379).
func RedisAddr(t testing.TB) string {
	return resolve(t, service{
		name: "Redis", env: "BERTH_REDIS_ADDR", fallback: "127.0.0.1:6379",
		addr: func(s string) string { return s }, docker: dockerRedis,
	})
}

// SQSEndpoint returns the base URL of an SQS-compatible endpoint
// (BERTH_SQS_ENDPOINT, else http://127.0.0.1:4566, where .ci/start-sqs runs
// the fauxqs emulator). Use region us-east-1 and any static credentials.
func SQSEndpoint(t testing.TB) string {
	return resolve(t, service{
		name: "SQS", env: "BERTH_SQS_ENDPOINT", fallback: "http://127.0.0.1:4566",
		addr: urlHostPort("4566"), docker: dockerLocalStack,
	})
}

// NATSURL returns the URL of a NATS server with JetStream enabled
// (BERTH_NATS_URL, else nats://127.0.0.1:4222, where the machine and
// scripts/services run nats-server -js).
func NATSURL(t testing.TB) string {
	return resolve(t, service{
		name: "NATS", env: "BERTH_NATS_URL", fallback: "nats://127.0.0.1:4222",
		addr: urlHostPort("4222"), docker: dockerNATS,
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
	ep, dockerErr := s.docker()
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

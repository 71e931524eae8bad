// Package containers starts the services of package integration in Docker
// containers (through dockertest) when neither an environment variable nor
// the usual loopback address provides them. Import it for its side effect in
// the tests that want containers:
//
//	import _ "github.com/berthq/berth/integration/containers"
//
// It is a package of its own so that tests that only need an endpoint do not
// link Docker's client: package integration imports no container library.
package containers

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/berthq/berth/integration"
	"github.com/ory/dockertest/v3"
)

func init() { integration.UseContainers(Start) }

// Start starts a container for service, one of the integration.Service
// constants, and returns its endpoint in the form the integration helper for
// that service returns. It fails when no Docker daemon answers.
func Start(service string) (string, error) {
	switch service {
	case integration.ServiceRabbitMQ:
		return dockerRabbitMQ()
	case integration.ServicePostgres:
		return dockerPostgres()
	case integration.ServiceRedis:
		return dockerRedis()
	case integration.ServiceSQS:
		return dockerLocalStack()
	case integration.ServiceNATS:
		return dockerNATS()
	}
	return "", fmt.Errorf("containers: unknown service %q", service)
}

// containerTTL bounds how long a container started for tests lives: the
// helpers have no hook at the end of a test binary, so Docker removes the
// container itself when this expires.
const containerTTL = 15 * 60 // seconds

func dockerPool() (*dockertest.Pool, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("no Docker daemon: %w", err)
	}
	pool.MaxWait = 90 * time.Second
	return pool, nil
}

// startContainer runs repo:tag, waits until port answers on the host, and
// returns the host port.
func startContainer(repo, tag string, env []string, cmd []string, port string) (string, error) {
	pool, err := dockerPool()
	if err != nil {
		return "", err
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{Repository: repo, Tag: tag, Env: env, Cmd: cmd})
	if err != nil {
		return "", err
	}
	if err := res.Expire(containerTTL); err != nil {
		_ = pool.Purge(res)
		return "", err
	}
	hostPort := res.GetHostPort(port)
	if hostPort == "" {
		_ = pool.Purge(res)
		return "", errors.New("container exposes no " + port)
	}
	if err := pool.Retry(func() error { return probe(hostPort) }); err != nil {
		_ = pool.Purge(res)
		return "", err
	}
	return hostPort, nil
}

func dockerRabbitMQ() (string, error) {
	hp, err := startContainer("rabbitmq", "3.13-alpine", nil, nil, "5672/tcp")
	if err != nil {
		return "", err
	}
	// The port answers before the broker accepts AMQP; wait for a handshake.
	time.Sleep(5 * time.Second)
	return "amqp://guest:guest@" + hp + "/", nil
}

func dockerPostgres() (string, error) {
	hp, err := startContainer("postgres", "16-alpine",
		[]string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=test"}, nil, "5432/tcp")
	if err != nil {
		return "", err
	}
	time.Sleep(3 * time.Second) // the entrypoint restarts the server once after init
	return "postgres://postgres@" + hp + "/test?sslmode=disable", nil
}

func dockerRedis() (string, error) {
	return startContainer("redis", "7-alpine", nil, []string{"redis-server", "--save", "", "--appendonly", "no"}, "6379/tcp")
}

func dockerLocalStack() (string, error) {
	hp, err := startContainer("localstack/localstack", "3", []string{"SERVICES=sqs"}, nil, "4566/tcp")
	if err != nil {
		return "", err
	}
	host, port, _ := net.SplitHostPort(hp)
	return "http://" + net.JoinHostPort(host, port), nil
}

func dockerNATS() (string, error) {
	hp, err := startContainer("nats", "2.10-alpine", nil, []string{"-js"}, "4222/tcp")
	if err != nil {
		return "", err
	}
	return "nats://" + hp, nil
}

func probe(hostport string) error {
	c, err := net.DialTimeout("tcp", hostport, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

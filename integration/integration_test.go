package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" { // re-executed as a worker by a fault test
		os.Exit(runChild())
	}
	code := m.Run()
	httpTransport.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestURLHostPortHidesNothingButHost(t *testing.T) {
	f := urlHostPort("5672")
	cases := map[string]string{
		"amqp://guest:secret@127.0.0.1:5673/vhost": "127.0.0.1:5673",
		"amqps://u:p@rabbit.example":               "rabbit.example:5672",
		"amqp://[::1]/":                            "[::1]:5672",
		"::not a url":                              "invalid-url:0",
	}
	for in, want := range cases {
		if got := f(in); got != want {
			t.Errorf("urlHostPort(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every service CI starts answers here; in CI a missing one fails instead of
// skipping, which is what this test proves for the machine it runs on.
func TestServicesAnswer(t *testing.T) {
	for name, get := range map[string]func(testing.TB) string{
		"rabbitmq": RabbitMQURL, "postgres": PostgresDSN, "redis": RedisAddr, "sqs": SQSEndpoint, "nats": NATSURL,
	} {
		t.Run(name, func(t *testing.T) {
			if ep := get(t); ep == "" {
				t.Fatal("empty endpoint")
			}
		})
	}
}

func TestEnvOverrideMustAnswer(t *testing.T) {
	t.Setenv("BERTH_REDIS_ADDR", "127.0.0.1:1") // nothing listens on port 1
	_, err := find(service{name: "x", env: "BERTH_REDIS_ADDR", fallback: "127.0.0.1:6379",
		addr: func(s string) string { return s }})
	if err == nil {
		t.Fatal("an unreachable override must be an error, not silently replaced by the default")
	}
}

// TestContainersOnlyWhenAsked: a service that does not answer is started in
// a container only through the registered ContainerStarter, and the error
// without one says how to ask for containers.
func TestContainersOnlyWhenAsked(t *testing.T) {
	mu.Lock()
	saved := starter
	starter = nil
	mu.Unlock()
	t.Cleanup(func() { UseContainers(saved) })

	s := service{name: ServiceRedis, env: "BERTH_TEST_UNSET_ADDR", fallback: "127.0.0.1:1", addr: func(s string) string { return s }}
	if _, err := find(s); err == nil || !strings.Contains(err.Error(), "integration/containers") {
		t.Fatalf("without containers: %v, want an error naming integration/containers", err)
	}
	var asked string
	UseContainers(func(service string) (string, error) { asked = service; return "127.0.0.1:7777", nil })
	ep, err := find(s)
	if err != nil || ep != "127.0.0.1:7777" || asked != ServiceRedis {
		t.Fatalf("with a starter: %q, %v (asked for %q); want the starter's endpoint for %s", ep, err, asked, ServiceRedis)
	}
}

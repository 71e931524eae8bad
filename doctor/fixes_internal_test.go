package doctor

import (
	"context"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/rabbitmq"
	"github.com/berthq/berth/sdk"
)

// argsRabbit answers QueueArguments from a table: the local RabbitMQ (3.10)
// does not report x-consumer-timeout back, so the check's comparison is
// tested here.
type argsRabbit struct {
	args    map[string]map[string]any
	version string
}

func (f argsRabbit) QueueArguments(_ context.Context, q string) (map[string]any, error) {
	a, ok := f.args[q]
	if !ok {
		return nil, sdk.ErrNotFound
	}
	return a, nil
}

func (f argsRabbit) Info(context.Context, string) (rabbitmq.QueueInfo, error) {
	return rabbitmq.QueueInfo{}, nil
}

func (f argsRabbit) ServerVersion(context.Context) (string, error) { return f.version, nil }

func (f argsRabbit) ExchangeExists(context.Context, string) (bool, error) { return true, nil }

// Workers whose jobs have no time limit (LongestJob < 0) against a queue
// whose consumer timeout is 30 min: a job running longer has its channel
// closed, which is an Error, not OK.
func TestConsumerTimeoutAgainstUnboundedJobs(t *testing.T) {
	q := "billing"
	b := argsRabbit{args: map[string]map[string]any{
		q: {"x-queue-type": "quorum", "x-delivery-limit": int64(10), "x-dead-letter-exchange": "berth.dlx",
			"x-consumer-timeout": (30 * time.Minute).Milliseconds()},
		rabbitmq.DeadLetterQueue(q): {"x-queue-type": "quorum"},
	}}
	for longest, want := range map[time.Duration]Severity{-1: Error, time.Hour: Error, 10 * time.Minute: OK} {
		fs, err := rabbitQueue(context.Background(), b, q, serverVersion{announced: "3.13.7"}, rabbitmq.DefaultDelayBuckets, Options{LongestJob: longest}.withDefaults())
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, f := range fs {
			if f.ID == "rabbitmq.consumer-timeout" {
				found = true
				if f.Severity != want {
					t.Errorf("longest job %s: %s (%s), want %s", longest, f.Severity, f.Evidence, want)
				}
			}
		}
		if !found {
			t.Errorf("longest job %s: no rabbitmq.consumer-timeout finding", longest)
		}
	}
}

func TestPGFalse(t *testing.T) {
	for v, want := range map[string]bool{"false": true, "FALSE": true, "f": true, "fa": true, "no": true, "n": true, "off": true, "of": true, "0": true,
		"true": false, "t": false, "yes": false, "on": false, "1": false, "": false, "o": false, "falsey": false} {
		if got := pgFalse(v); got != want {
			t.Errorf("pgFalse(%q) = %v, want %v", v, got, want)
		}
	}
}

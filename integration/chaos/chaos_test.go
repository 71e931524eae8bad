package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/integration"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" { // re-executed as a worker
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}

// The short form of the chaos command, as CI runs it: 15 seconds of faults
// per broker, then every invariant read from the database and the broker.
func TestChaosShort(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	for _, kind := range []string{"postgres", "rabbitmq", "sqs"} {
		t.Run(kind, func(t *testing.T) {
			c := config{Broker: kind, Duration: 15 * time.Second, Workers: 3, Rate: 20, PostgresDSN: dsn,
				Settle: 90 * time.Second, LogDir: t.TempDir()}
			switch kind {
			case "rabbitmq":
				c.RabbitMQURL = integration.RabbitMQURL(t)
			case "sqs":
				c.SQSEndpoint = integration.SQSEndpoint(t)
			}
			var out strings.Builder
			rep, err := run(context.Background(), c, &out)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range rep.Violations {
				t.Error(v)
			}
			faults := 0
			for _, n := range rep.Faults {
				faults += n
			}
			if rep.Valid == 0 || rep.Poison == 0 || faults < 5 {
				t.Errorf("the run exercised too little: %d orders, %d poison, %d faults", rep.Valid, rep.Poison, faults)
			}
			if rep.ChargedOnce != rep.Valid {
				t.Errorf("charged once %d, want %d", rep.ChargedOnce, rep.Valid)
			}
		})
	}
}

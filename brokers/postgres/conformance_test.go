package postgres_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/brokertest"
	"github.com/berthq/berth/brokers/postgres"
	"github.com/berthq/berth/sdk"
)

func TestConformance(t *testing.T) {
	pool := newPool(t, "berth-conformance-"+suffix(), 16)
	const lease, maxDeliveries = time.Second, 3
	brokertest.Run(t, brokertest.Harness{
		New: func(t *testing.T) sdk.Broker {
			return newBroker(t, pool, postgres.Options{
				Lease:        lease,
				MaxAttempts:  maxDeliveries,
				PollInterval: 200 * time.Millisecond,
				Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
		},
		Lease:          lease,
		MaxDeliveries:  maxDeliveries,
		MaxMessageSize: postgres.DefaultMaxMessageSize,
	})
}

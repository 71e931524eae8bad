package brokerurl_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
	"github.com/berthq/berth/telemetry"
)

// The broker postgres:// opens (the PostgreSQL broker with the pool it
// owns) counts its publishes under messaging.system "postgres", as the
// PostgreSQL broker does and as its deliveries do. telemetry names the
// system after the publisher's package, and the wrapper that closes the
// pool lives in brokerurl: every publish through it was counted, and traced,
// under the system "brokerurl".
func TestPostgresTelemetrySystem(t *testing.T) {
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
	u.RawQuery = q.Encode()
	b, err := brokerurl.Open(ctx, u.String(), brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		if conn, err := pgx.Connect(context.Background(), dsn); err == nil {
			_, _ = conn.Exec(context.Background(), `DROP SCHEMA "`+schema+`" CASCADE`)
			_ = conn.Close(context.Background())
		}
	})
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	obs, err := telemetry.New(telemetry.Options{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	if err := obs.Publisher(b).Publish(ctx, "q", &sdk.Message{Type: "t"}); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	var systems []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "messaging.client.sent.messages" {
				for _, dp := range s.DataPoints {
					v, _ := dp.Attributes.Value(attribute.Key(semconv.MessagingSystemKey))
					systems = append(systems, v.AsString())
				}
			}
		}
	}
	if len(systems) != 1 || systems[0] != "postgres" {
		t.Fatalf("messaging.client.sent.messages counted under the systems %q, want [postgres]", systems)
	}
}

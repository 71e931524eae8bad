package brokerurl_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// A parameter given twice in Options.Defaults is refused with a ParamError,
// as one given twice in the URL is, rather than the first value used
// silently. The URL's own value still overrides a (single) default.
func TestDefaultGivenTwiceIsRefused(t *testing.T) {
	ctx := context.Background()
	b, err := brokerurl.Open(ctx, "mem://", brokerurl.Options{Defaults: url.Values{"lease": {"5s", "10s"}}})
	if b != nil {
		b.Close()
	}
	var pe *brokerurl.ParamError
	if !errors.As(err, &pe) || pe.Param != "lease" || !errors.Is(err, brokerurl.ErrInvalidURL) || !strings.Contains(pe.Reason, "more than once") {
		t.Fatalf("Open with lease given twice in Defaults = %v, want a ParamError naming lease", err)
	}
	// The URL sets it: the defaults are not read.
	b, err = brokerurl.Open(ctx, "mem://?lease=1s", brokerurl.Options{Defaults: url.Values{"lease": {"5s", "10s"}}})
	if err != nil {
		t.Fatalf("the URL's lease beside a doubled default: %v", err)
	}
	if l := b.(*memory.Broker).Lease(); l.String() != "1s" {
		t.Errorf("lease %s, want the URL's 1s", l)
	}
	b.Close()
}

// postgres:// refuses a dotted parameter it does not know, which pgx would
// send to PostgreSQL as an unchecked custom setting, and a pgx parameter
// given twice; all before connecting (port 1: nothing listens).
func TestPostgresRefusesDottedAndDoubledParams(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ url, param string }{
		{"postgres://u:" + secret + "@127.0.0.1:1/db?foo.bar=1", "foo.bar"},
		{"postgresql://u@127.0.0.1:1/db?sslmode=disable&berth.lease=1s", "berth.lease"},
		{"postgres://u@127.0.0.1:1/db?sslmode=disable&sslmode=require", "sslmode"},
	} {
		if err, ok := wantParamError(t, ctx, c.url, c.param); ok && strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q): the error shows the secret: %v", c.url, err)
		}
	}
}

// mem:// takes the memory broker's negative options: no delivery cap and no
// size limit.
func TestMemoryNegativeOptions(t *testing.T) {
	ctx := context.Background()
	b, err := brokerurl.Open(ctx, "mem://?max_deliveries=-1&max_message_size=-1", brokerurl.Options{})
	if err != nil {
		t.Fatalf("mem:// with the memory broker's negative options: %v", err)
	}
	defer b.Close()
	if n := b.(*memory.Broker).MaxDeliveries(); n != 0 {
		t.Errorf("MaxDeliveries = %d, want 0 (no cap)", n)
	}
	big := &sdk.Message{Type: "t", Body: make([]byte, memory.DefaultMaxMessageSize+1)}
	if err := b.Publish(ctx, "q", big); err != nil {
		t.Errorf("Publish past the default size with max_message_size=-1: %v", err)
	}
	// Still refused: a value that is no integer, and the options where
	// the memory broker takes no negative value.
	wantParamError(t, ctx, "mem://?max_deliveries=none", "max_deliveries")
	if _, err := brokerurl.Open(ctx, "mem://?max_backlog=-1", brokerurl.Options{}); err == nil {
		t.Error("mem://?max_backlog=-1 opened")
	}
}

// The documented way to set a custom (dotted) PostgreSQL setting on purpose,
// options=-c name=value, still reaches the server.
func TestPostgresCustomSettingThroughOptions(t *testing.T) {
	dsn := integration.PostgresDSN(t)
	ctx := context.Background()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", "-c berth_test.flag=on")
	u.RawQuery = q.Encode()
	b, err := brokerurl.Open(ctx, u.String(), brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var pool *pgxpool.Pool
	if as, ok := b.(interface{ As(any) bool }); !ok || !as.As(&pool) {
		t.Fatalf("As(*pgxpool.Pool) of %T", b)
	}
	var v string
	if err := pool.QueryRow(ctx, `SELECT current_setting('berth_test.flag')`).Scan(&v); err != nil || v != "on" {
		t.Fatalf("berth_test.flag = %q, %v; want on", v, err)
	}
}

package brokerurl_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokerurl"
	"github.com/berthq/berth/integration"
)

// A parameter postgres:// hands on to pgx whose value pgx refuses (a
// misspelt sslmode, a timeout that is no number, a CA file that cannot be
// read) is a ParamError naming it, as the package promises for any value
// that cannot be used. It was a bare "the connection string does not parse"
// naming nothing, so the one typo in "sslmode=required" had to be found by
// hand. The error still repeats neither the value nor the password.
func TestPostgresDriverParamIsNamed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u, err := url.Parse(integration.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), secret)
	for _, c := range []struct{ query, param string }{
		{"sslmode=required", "sslmode"},
		{"connect_timeout=soon", "connect_timeout"},
		{"sslmode=verify-full&sslrootcert=/nonexistent/berth-ca.pem", "sslrootcert"},
		{"pool_max_conns=0&application_name=x", "pool_max_conns"},
	} {
		v := *u
		v.RawQuery = c.query
		err, ok := wantParamError(t, ctx, v.String(), c.param)
		if ok && (strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "soon") || strings.Contains(err.Error(), "nonexistent")) {
			t.Errorf("Open(%q): the error repeats the value or the password: %v", v.String(), err)
		}
	}
	// A connection string pgx refuses for no one parameter is still an
	// ErrInvalidURL.
	b, err := brokerurl.Open(ctx, "postgres://u:"+secret+"@127.0.0.1:1/db?sslmode=required&connect_timeout=soon", brokerurl.Options{})
	if b != nil {
		b.Close()
	}
	if !errors.Is(err, brokerurl.ErrInvalidURL) || strings.Contains(err.Error(), secret) {
		t.Errorf("two bad pgx parameters: %v, want ErrInvalidURL", err)
	}
}

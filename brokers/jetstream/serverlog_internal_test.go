package jetstream

import (
	"strings"
	"testing"
)

// TestServerForLogHidesTokens: the reconnection log line named the server
// with nats.go's ConnectedUrlRedacted, which hides a password but not a
// token given as the URL's user: nats://TOKEN@host was logged whole at
// every reconnection. It names scheme and host only now.
func TestServerForLogHidesTokens(t *testing.T) {
	for raw, want := range map[string]string{
		"nats://s3cr3t-token@127.0.0.1:4222":   "nats://127.0.0.1:4222",
		"nats://user:s3cr3t-pw@127.0.0.1:4222": "nats://127.0.0.1:4222",
		"tls://s3cr3t-token@nats.example:4443": "tls://nats.example:4443",
		"nats://127.0.0.1:4222":                "nats://127.0.0.1:4222",
	} {
		got := serverForLog(raw)
		if got != want || strings.Contains(got, "s3cr3t") {
			t.Errorf("serverForLog(%q) = %q, want %q", raw, got, want)
		}
	}
	if got := serverForLog("nats://%zz@host"); strings.Contains(got, "zz") {
		t.Errorf("an unparsable URL is logged as %q", got)
	}
}

package dashboard

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The token is checked by comparing fixed-length digests: before, the
// presented token and Options.Token were compared as they are, and
// subtle.ConstantTimeCompare returns at once when their lengths differ, so
// how long a refusal took told the token's length. The test watches what is
// compared (never the clock): every comparison is of two inputs of one
// length, whatever the length of the token presented; a wrong token of
// another length and of the same length are refused, the right one, as a
// bearer token or a basic-auth password, accepted.
func TestTokenComparedAsDigests(t *testing.T) {
	const token = "s3cret-token-0123"
	type pair struct{ got, want int }
	var compared []pair
	constantTimeCompare = func(x, y []byte) int {
		compared = append(compared, pair{len(x), len(y)})
		return subtle.ConstantTimeCompare(x, y)
	}
	t.Cleanup(func() { constantTimeCompare = subtle.ConstantTimeCompare })

	h := requireToken(token, newAuthLog(slog.New(slog.DiscardHandler)), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	bearer := func(s string) func(*http.Request) {
		return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+s) }
	}
	basic := func(s string) func(*http.Request) {
		return func(r *http.Request) { r.SetBasicAuth("ops", s) }
	}
	for _, c := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"no token", func(*http.Request) {}, http.StatusUnauthorized},
		{"empty", bearer(""), http.StatusUnauthorized},
		{"shorter", bearer("s3cret"), http.StatusUnauthorized},
		{"longer", bearer(token + "x"), http.StatusUnauthorized},
		{"much longer", bearer(token + token + token), http.StatusUnauthorized},
		{"same length", bearer("s3cret-token-012X"), http.StatusUnauthorized},
		{"same length, basic", basic("x3cret-token-0123"), http.StatusUnauthorized},
		{"shorter, basic", basic("s"), http.StatusUnauthorized},
		{"right", bearer(token), http.StatusNoContent},
		{"right, basic", basic(token), http.StatusNoContent},
	} {
		compared = nil
		r := httptest.NewRequest("GET", "/api/queues", nil)
		c.set(r)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != c.want {
			t.Errorf("%s: %d, want %d", c.name, rec.Code, c.want)
		}
		if c.want == http.StatusUnauthorized && rec.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%s: a 401 without WWW-Authenticate", c.name)
		}
		if len(compared) != 1 {
			t.Fatalf("%s: %d comparisons, want 1", c.name, len(compared))
		}
		if p := compared[0]; p.got != sha256.Size || p.want != sha256.Size {
			t.Errorf("%s: compared %d bytes with %d, want two SHA-256 digests (%d bytes each), whatever the token's length", c.name, p.got, p.want, sha256.Size)
		}
	}
}

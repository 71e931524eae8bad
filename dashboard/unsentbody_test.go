package dashboard_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/dashboard"
)

// A request without the token is answered 401 at once, even when it
// announced a body it does not send. Before, the server waited for that
// body before it answered (to keep the connection), for ever: berth ui has
// no ReadTimeout (it would cut a long redrive), so anyone who could reach
// the address, without the token, could hold connections until the process
// ran out of files. The answer's deadline is generous: without the fix it
// never comes.
func TestUnauthorizedRequestDoesNotWaitForItsBody(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 1, 0)
	srv := serve(t, b, dashboard.Options{Token: testToken})
	for _, head := range []string{
		"POST /api/queues/billing/purge HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
		"POST /queues/billing/purge HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n",
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(head)); err != nil { // the body never follows
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		line, _, _ := strings.Cut(head, "\r\n")
		if err != nil {
			t.Errorf("%s without its body: no answer: %v", line, err)
		} else if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s without its body: %d, want 401", line, resp.StatusCode)
		}
		c.Close()
	}
	if st := stats(t, b); st.DeadLettered != 1 {
		t.Fatalf("an unauthorized request changed something: %+v", st)
	}
}

// A browser's first request, without the token and without a body, is
// answered 401 on a connection that serves the next request, with the
// token. (Cutting the body of every refused request ended the connection's
// context too: the request after the 401 on it failed with 500.)
func TestUnauthorizedRequestKeepsItsConnection(t *testing.T) {
	b := memoryBroker(t)
	seed(t, b, 1, 0)
	srv := serve(t, b, dashboard.Options{Token: testToken})
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	for _, want := range []struct {
		auth string
		code int
	}{{"", http.StatusUnauthorized}, {"Authorization: Bearer " + testToken + "\r\n", http.StatusOK}} {
		if _, err := c.Write([]byte("GET /queues/billing HTTP/1.1\r\nHost: x\r\n" + want.auth + "\r\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("auth %q: %v", want.auth, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want.code {
			t.Fatalf("auth %q on the connection of the 401: %d, want %d", want.auth, resp.StatusCode, want.code)
		}
	}
}

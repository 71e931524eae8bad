package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/dashboard"
	"github.com/berthq/berth/integration"
	"github.com/berthq/berth/sdk"
)

// sqsBroker returns a broker on the SQS emulator and a fresh queue with its
// dead-letter queue, both deleted when the test ends. Its HTTP transport is
// the test's, so that its idle connections close with the test.
func sqsBroker(t *testing.T) (*sqs.Broker, string) {
	t.Helper()
	tr := &http.Transport{}
	client := awssqs.New(awssqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(integration.SQSEndpoint(t)),
		Credentials: credentials.NewStaticCredentialsProvider("berth", "berth", ""),
		HTTPClient:  &http.Client{Transport: tr},
	})
	b, err := sqs.New(client, sqs.Options{WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	queue := fmt.Sprintf("berth_dashboard_%d", rand.Uint64()%1e12)
	t.Cleanup(func() {
		_ = b.DeleteQueue(context.Background(), queue, true)
		_ = b.Close()
		tr.CloseIdleConnections()
	})
	if err := b.DeclareQueue(context.Background(), queue); err != nil {
		t.Fatal(err)
	}
	return b, queue
}

// TestSQS drives the dashboard's JSON API and pages on dead letters the SQS
// broker made: counts, filters, one message, escaping, a dry run, a redrive
// by IDs with one gone, a filtered purge, and a redrive of all whose own scan
// stops early (reported as incomplete, not as an error).
func TestSQS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b, q := sqsBroker(t)
	const n = 6 // transient: 0, 3 (timeouts) and 5 (hostile); refunds: 3
	msgs := make([]*sdk.Message, n)
	for i := range msgs {
		typ := "billing.charge"
		if i%4 == 3 {
			typ = "billing.refund"
		}
		msgs[i] = &sdk.Message{Type: typ, Body: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	msgs[n-1].Body = []byte(`<script>alert(1)</script>` + "\x1b[2J")
	if err := b.Publish(ctx, q, msgs...); err != nil {
		t.Fatal(err)
	}
	ids := map[int]string{}
	for len(ids) < n {
		ds, err := b.Receive(ctx, q, n-len(ids))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			i := n - 1
			fmt.Sscanf(string(d.Message().Body), `{"n":%d}`, &i)
			cause := sdk.Permanent(fmt.Errorf("card %d declined", i))
			switch {
			case i == n-1:
				cause = errors.New("<b>bold</b> \x1b[31mred")
			case i%3 == 0:
				cause = fmt.Errorf("gateway timeout %d", i)
			}
			if err := d.DeadLetter(ctx, cause); err != nil {
				t.Fatal(err)
			}
			ids[i] = d.Message().ID
		}
	}
	srv := serve(t, b, dashboard.Options{Queues: []string{q}})
	api := srv.URL + "/api/queues/" + q

	stats := func() sdk.QueueStats {
		t.Helper()
		st, err := b.Stats(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	code, body := get(t, http.DefaultClient, srv.URL+"/api/queues")
	if code != 200 || !strings.Contains(body, `"queue":"`+q+`"`) || !strings.Contains(body, fmt.Sprintf(`"dead_lettered":%d`, n)) {
		t.Fatalf("overview: %d %s", code, body)
	}
	var l struct {
		Matched  int    `json:"matched"`
		Total    int    `json:"total_dead_letters"`
		Complete bool   `json:"complete"`
		Messages []any  `json:"messages"`
		Why      string `json:"incomplete"`
	}
	code, body = get(t, http.DefaultClient, api+"/dead-letters?class=permanent&limit=2")
	if code != 200 || json.Unmarshal([]byte(body), &l) != nil || l.Matched != 3 || l.Total != n || !l.Complete || len(l.Messages) != 2 {
		t.Fatalf("list: %d %s", code, body)
	}
	if code, body := get(t, http.DefaultClient, api+"/dead-letters/"+ids[3]); code != 200 || !strings.Contains(body, `"class":"transient"`) || !strings.Contains(body, `"type":"billing.refund"`) {
		t.Fatalf("one: %d %s", code, body)
	}
	if code, _ := get(t, http.DefaultClient, api+"/dead-letters/nope"); code != 404 {
		t.Fatalf("missing: %d", code)
	}
	for _, path := range []string{"/queues/" + q, "/queues/" + q + "/messages/" + ids[n-1]} {
		code, page := get(t, http.DefaultClient, srv.URL+path)
		if code != 200 || !strings.Contains(page, `&lt;b&gt;bold&lt;/b&gt; \x1b[31mred`) {
			t.Fatalf("%s: %d, the reason not shown escaped", path, code)
		}
		for _, raw := range []string{"<script>alert", "<b>bold", "\x1b"} {
			if strings.Contains(page, raw) {
				t.Errorf("%s has %q raw", path, raw)
			}
		}
	}

	code, body = post(t, mustReq("POST", api+"/redrive", "application/json", `{"all":true,"reason":"timeout","dry_run":true}`))
	if code != 200 || !strings.Contains(body, `"matched":2`) || !strings.Contains(body, `"done":0`) || stats().DeadLettered != n {
		t.Fatalf("dry run: %d %s", code, body)
	}
	code, body = post(t, mustReq("POST", api+"/redrive", "application/json", `{"ids":["`+ids[1]+`","gone"]}`))
	if code != 200 || !strings.Contains(body, `"done":1`) || !strings.Contains(body, `"missed":1`) || !strings.Contains(body, `"id":"gone"`) {
		t.Fatalf("redrive ids: %d %s", code, body)
	}
	code, body = post(t, mustReq("POST", api+"/purge", "application/json", `{"all":true,"type":"billing.refund"}`))
	if code != 200 || !strings.Contains(body, `"done":1`) {
		t.Fatalf("filtered purge: %d %s", code, body)
	}
	if st := stats(); st.DeadLettered != n-2 || st.Ready != 1 {
		t.Fatalf("after: %+v", st)
	}
	// Through the pages: confirm states the count, the POST does it.
	code, page := get(t, http.DefaultClient, srv.URL+"/queues/"+q+"/confirm?action=redrive&all=1&class=transient")
	if code != 200 || !strings.Contains(page, `<span id="confirm-count">2</span>`) {
		t.Fatalf("confirm: %d\n%s", code, page)
	}
	form := url.Values{"all": {"1"}, "class": {"transient"}, "limit": {"2"}}
	code, page = post(t, mustReq("POST", srv.URL+"/queues/"+q+"/redrive", "application/x-www-form-urlencoded", form.Encode()))
	if code != 200 || !strings.Contains(page, "redriven 2 dead letter(s)") {
		t.Fatalf("form redrive: %d", code)
	}

	if st := stats(); st.DeadLettered != n-4 || st.Ready != 3 {
		t.Fatalf("after the form: %+v", st)
	}
	// Two copies of one message: SQS's redrive of all moves the first and
	// stops at the second. The API says so, and what it did.
	dup := &sdk.Message{ID: sdk.NewID(), Type: "dl", Body: []byte("twice")}
	for range 2 {
		if err := b.Publish(ctx, q+"-dlq", dup.Clone()); err != nil {
			t.Fatal(err)
		}
	}
	left := stats().DeadLettered // n-3 and the two copies
	code, body = post(t, mustReq("POST", api+"/redrive", "application/json", `{"all":true}`))
	var res struct {
		Done     int    `json:"done"`
		Complete bool   `json:"complete"`
		Why      string `json:"incomplete"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &res) != nil || int64(res.Done) != left-1 || res.Complete || !strings.Contains(res.Why, "same ID") {
		t.Fatalf("redrive all with a duplicate: %d %s (%d dead letters before)", code, body, left)
	}
	if st := stats(); st.DeadLettered != 1 {
		t.Fatalf("after redrive all: %+v", st)
	}
}

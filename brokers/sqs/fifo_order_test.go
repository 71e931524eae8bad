package sqs_test

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// TestFIFOPublishHaltsARefusedGroup: a FIFO Publish of more than 10
// messages is sent in calls of 10, one after another. SQS refused an entry
// of group A in the first call, and the later calls still carried A's later
// messages, which SQS stored ahead of the refused one: group A out of
// order. Now A's later messages are not sent and are named in the
// PublishError (wrapping ErrGroupHalted); group B goes on.
func TestFIFOPublishHaltsARefusedGroup(t *testing.T) {
	var mu sync.Mutex
	var sent [][]string // message bodies per SendMessageBatch call
	client := newFakeSQS(t, func(op string, n int, req map[string]any) string {
		switch op {
		case "GetQueueUrl":
			return `{"QueueUrl":"http://fake/000000000000/q.fifo"}`
		case "SendMessageBatch":
		default:
			return `{}`
		}
		var bodies []string
		ok, failed := "", ""
		for i, e := range req["Entries"].([]any) {
			bodies = append(bodies, e.(map[string]any)["MessageBody"].(string))
			if n == 1 && i == 2 { // the first call: refuse A's second message
				failed = `{"Id":"2","Code":"InternalError","Message":"try again","SenderFault":false}`
				continue
			}
			if ok != "" {
				ok += ","
			}
			ok += fmt.Sprintf(`{"Id":"%d","MessageId":"x%d","MD5OfMessageBody":"x"}`, i, i)
		}
		mu.Lock()
		sent = append(sent, bodies)
		mu.Unlock()
		return `{"Successful":[` + ok + `],"Failed":[` + failed + `]}`
	})
	b, err := sqs.New(client, sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var msgs []*sdk.Message
	for i := range 24 { // A0 B1 A2 B3 ...: A's messages are the even ones
		g := "A"
		if i%2 == 1 {
			g = "B"
		}
		msgs = append(msgs, &sdk.Message{Key: g, Body: []byte(g + strconv.Itoa(i))})
	}
	err = b.Publish(testCtx(t), "q.fifo", msgs...)
	var pe *sdk.PublishError
	if !errors.As(err, &pe) {
		t.Fatalf("Publish = %v; want a *sdk.PublishError", err)
	}
	var ee *sqs.EntryError
	if !errors.As(pe.Failed[msgs[2].ID], &ee) || ee.Code != "InternalError" {
		t.Errorf("the refused message's error = %v; want SQS's EntryError", pe.Failed[msgs[2].ID])
	}
	for i, m := range msgs {
		switch {
		case i == 2:
		case i%2 == 0 && i >= 10: // A's, in the later calls
			if !errors.Is(pe.Failed[m.ID], sqs.ErrGroupHalted) || errors.Is(pe.Failed[m.ID], sdk.ErrUnavailable) {
				t.Errorf("%s: %v; want an error wrapping ErrGroupHalted (certainly not sent)", m.Body, pe.Failed[m.ID])
			}
		default:
			if pe.Failed[m.ID] != nil {
				t.Errorf("%s: %v; want it published", m.Body, pe.Failed[m.ID])
			}
		}
	}
	if len(pe.Failed) != 8 { // A2, and A10..A22
		t.Errorf("PublishError names %d messages, want 8", len(pe.Failed))
	}
	mu.Lock()
	defer mu.Unlock()
	var later []string
	for _, call := range sent[1:] {
		later = append(later, call...)
	}
	want := []string{"B11", "B13", "B15", "B17", "B19", "B21", "B23"}
	if len(sent) < 2 || len(sent[0]) != 10 || fmt.Sprint(later) != fmt.Sprint(want) {
		t.Errorf("calls %v; want the first 10, then B's later messages only, in order (%v)", sent, want)
	}
}

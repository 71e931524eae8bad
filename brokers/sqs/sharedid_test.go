package sqs_test

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/sdk"
)

// Two dead letters sharing a berth ID (a message dead-lettered twice: SQS
// delivers at least once, and its redrive policy can move a message berth
// dead-lettered too) redriven in one page, where SQS takes one's copy and
// refuses the other's. The redrive read each letter's outcome by looking
// its berth ID up in the PublishError: the refusal of one was taken for the
// other's too, so the letter whose copy went out stayed in the dead-letter
// queue beside its copy, to be redriven again (a duplicate job). Outcomes
// are now read by entry: the sent letter is deleted, the refused one stays.
// Both ways a page is sent are checked: in one SendMessageBatch call, and
// in calls made at once (the copies do not fit one call's MaxWireSize).
func TestRedriveSharedIDByEntry(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxWire     int // Options.MaxWireSize, 0 for the default
		small, big  int // body sizes
		loweredSize int // q's MaximumMessageSize once lowered
		calls       int // SendMessageBatch calls of the redrive
	}{
		{"one call", 0, 5, 2000, 1024, 1},
		{"two calls", 4096, 1500, 3000, 2048, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each scan ends with a 1 s long poll
			redriveSharedID(t, tc.maxWire, tc.small, tc.big, tc.loweredSize, tc.calls)
		})
	}
}

func redriveSharedID(t *testing.T, maxWire, smallBody, bigBody, lowered, calls int) {
	ctx := testCtx(t)
	raw := newClient(t)
	opts := fastOptions()
	opts.MaxWireSize, opts.MaxMessageSize = maxWire, maxWire
	c := newCalls()
	b := newBroker(t, opts, c.option)
	q := declare(t, b, "sharedid", false, sqs.QueueConfig{})
	id := sdk.NewID()
	small := &sdk.Message{ID: id, Type: "dup", Body: bytes.Repeat([]byte("s"), smallBody)}
	big := &sdk.Message{ID: id, Type: "dup", Body: bytes.Repeat([]byte("x"), bigBody)}
	if err := b.Publish(ctx, q+"-dlq", small); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, q+"-dlq", big); err != nil {
		t.Fatal(err)
	}
	// The broker reads q's MaximumMessageSize and keeps it; then it is
	// lowered under the big letter, whose copy SQS refuses (the broker
	// does not check it against the lowered limit, which it has not read).
	if err := b.Publish(ctx, q, &sdk.Message{Type: "warm", Body: []byte("w")}); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: aws.String(queueURL(t, raw, q)),
		Attributes: map[string]string{string(sqstypes.QueueAttributeNameMaximumMessageSize): strconv.Itoa(lowered)}}); err != nil {
		t.Fatal(err)
	}
	c.reset()
	n, err := b.RedriveDeadLetters(ctx, q, id)
	if got := c.get("SendMessageBatch"); got != calls {
		t.Errorf("the redrive made %d SendMessageBatch calls, want %d", got, calls)
	}
	var pe *sdk.PublishError
	if !errors.As(err, &pe) || pe.Failed[id] == nil {
		t.Fatalf("RedriveDeadLetters = %d, %v; want a PublishError for the refused copy", n, err)
	}
	if n != 1 {
		t.Errorf("RedriveDeadLetters redrove %d, want 1 (the small letter; SQS refused the big one's copy)", n)
	}
	left, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	var bodies []int
	for _, m := range left {
		bodies = append(bodies, len(m.Body))
	}
	if !slices.Equal(bodies, []int{bigBody}) {
		t.Errorf("dead letters left with bodies of %v bytes, want only the refused one (%d): a letter whose copy "+
			"was sent stayed, to be redriven twice", bodies, bigBody)
	}
	if got := drainRaw(t, raw, queueURL(t, raw, q)); got != 2 {
		t.Errorf("%d messages in %s, want 2 (the warm-up and the small letter's copy)", got, q)
	}
}

// DeleteDeadLetters of a berth ID that two letters hold deletes both, as a
// redrive of it moves both: the CLI and dashboard confirm a change of an ID
// with every letter holding it. Before, the scan stopped at the first
// letter found, and one of the two stayed.
func TestDeleteSharedIDDeletesEveryLetter(t *testing.T) {
	ctx := testCtx(t)
	b := newBroker(t, fastOptions())
	q := declare(t, b, "sharedid-del", false, sqs.QueueConfig{})
	id := sdk.NewID()
	for _, body := range []string{"a", "b"} {
		if err := b.Publish(ctx, q+"-dlq", &sdk.Message{ID: id, Type: "dup", Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Publish(ctx, q+"-dlq", &sdk.Message{Type: "own", Body: []byte("c")}); err != nil {
		t.Fatal(err)
	}
	n, err := b.DeleteDeadLetters(ctx, q, id)
	if err != nil || n != 2 {
		t.Fatalf("DeleteDeadLetters(%s) = %d, %v; want both letters holding it", id, n, err)
	}
	left, err := b.ListDeadLetters(ctx, q, 10)
	if err != nil || len(left) != 1 || left[0].Type != "own" {
		t.Errorf("left %d letters (%v), want the other one only", len(left), err)
	}
}

package sqs_test

import (
	"sync"
	"testing"

	"github.com/berthq/berth/brokers/sqs"
)

// TestEntryRefusedAfterALostAnswerIsUncertain: the SDK retried a call
// whose first answer was lost (SQS took its messages), and SQS's answer to
// the retry names every entry as failed on its side. That refusal is the
// retry's: the messages may have been published by the first attempt, and
// their errors must say so (sdk.ErrUnavailable), not that they were not.
func TestEntryRefusedAfterALostAnswerIsUncertain(t *testing.T) {
	t.Run("one chunk", func(t *testing.T) { publishThenEntriesFailed(t, "lostfailed", 2) })
	t.Run("two chunks", func(t *testing.T) { publishThenEntriesFailed(t, "lostfailed2", 11) })
}

// publishThenEntriesFailed publishes k messages through a client that tries
// three times, to a server that answers each call's first attempt by taking
// its messages and dropping the connection, and its retries by naming
// every entry failed.
func publishThenEntriesFailed(t *testing.T, prefix string, k int) {
	t.Helper()
	var mu sync.Mutex
	attempts := map[string]int{} // by a chunk's first body
	client, srv := newBatchServer(t, func(_ int, bodies []string) int {
		mu.Lock()
		defer mu.Unlock()
		attempts[bodies[0]]++
		if attempts[bodies[0]] == 1 {
			return dropAnswer
		}
		return failEntries
	})
	b, err := sqs.New(retrying(client, 3), sqs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	msgs := bodied(prefix, k)
	err = b.Publish(testCtx(t), "q", msgs...)
	checkUncertainOutcome(t, err, srv, msgs)
}

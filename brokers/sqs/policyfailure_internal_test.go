package sqs

import (
	"testing"
	"time"

	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// TestPolicyFailureTimes: a dead letter SQS's redrive policy moved gets its
// failure times from the attributes SQS keeps with it, never the listing's
// time while it has one of them.
func TestPolicyFailureTimes(t *testing.T) {
	now := time.UnixMilli(5_000_000)
	sent, received := time.UnixMilli(1_000_000), time.UnixMilli(2_000_000)
	attrs := func(kv ...string) sqstypes.Message {
		m := sqstypes.Message{Attributes: map[string]string{}}
		for i := 0; i < len(kv); i += 2 {
			m.Attributes[kv[i]] = kv[i+1]
		}
		return m
	}
	const sentAttr, recvAttr = "SentTimestamp", "ApproximateFirstReceiveTimestamp"
	for _, c := range []struct {
		name        string
		m           sqstypes.Message
		first, last time.Time
	}{
		{"both", attrs(sentAttr, "1000000", recvAttr, "2000000"), received, received},
		{"sent reset by the move", attrs(sentAttr, "2000000", recvAttr, "1000000"), sent, received},
		{"sent only", attrs(sentAttr, "1000000"), sent, sent},
		{"received only", attrs(recvAttr, "2000000"), received, received},
		{"neither", attrs(sentAttr, "garbage", recvAttr, "-1"), now, now},
	} {
		first, last := policyFailure(c.m, now)
		if !first.Equal(c.first) || !last.Equal(c.last) {
			t.Errorf("%s: failure times %v, %v; want %v, %v", c.name, first, last, c.first, c.last)
		}
	}
}

package jetstream

import (
	"testing"
	"time"
)

// seqOf reads IDs from the CLI and the dashboard, which anyone may type:
// it names a sequence only for the "<stream>:<seq>:<stored>" form seqID
// writes, and takes every other string, however long or odd, as no
// sequence, without a panic. Only the letter at that sequence listed with
// the same whole ID is then taken (lookup compares the IDs), so a stamp
// that parses but is not the letter's (leading zeros, a sign) names none.
func TestSeqOfUntrustedIDs(t *testing.T) {
	q := &queueState{dlq: "BERTH_DLQ_q"}
	stored := time.Unix(1796287244, 562449089)
	if seq, ok := seqOf(q, seqID(q.dlq, 42, stored)); !ok || seq != 42 {
		t.Fatalf("seqOf(seqID(42)) = %d, %v", seq, ok)
	}
	if seq, ok := seqOf(q, seqID(q.dlq, 7, time.Unix(0, -5))); !ok || seq != 7 {
		t.Fatalf("seqOf of a stamp before 1970 = %d, %v", seq, ok)
	}
	for _, id := range []string{
		"", ":", "BERTH_DLQ_q", "BERTH_DLQ_q:", "BERTH_DLQ_q::", "BERTH_DLQ_q:42", "BERTH_DLQ_q:42:",
		"BERTH_DLQ_q::1", "BERTH_DLQ_q:0:1", "BERTH_DLQ_q:-1:1", "BERTH_DLQ_q:+1:1", "BERTH_DLQ_q:1:1:1",
		"BERTH_DLQ_q:18446744073709551616:1", "BERTH_DLQ_q:1:9223372036854775808", "BERTH_DLQ_q:1:x",
		"BERTH_DLQ_q:1 :1", "BERTH_DLQ_q:１:1", "BERTH_DLQ_q:\x00:1", "BERTH_DLQ_qq:1:1", "BERTH_Q_q:1:1",
		"BERTH_DLQ_q:" + string(make([]byte, 1<<16)) + ":1",
	} {
		if seq, ok := seqOf(q, id); ok {
			t.Errorf("seqOf(%q) = %d, true; want no sequence", id, seq)
		}
	}
}

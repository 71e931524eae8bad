package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/sqs"
	"github.com/berthq/berth/internal/dlq"
)

// The SQS broker is the dlq.Progresser that dlq.Apply looks for.
var _ dlq.Progresser = (*sqs.Broker)(nil)

// barCount finds the counts a change's progress bar drew: "(k/total".
var barCount = regexp.MustCompile(`\((\d+)/(\d+)`)

// TestOnSQSProgressOfAll: an unfiltered "berth dlq redrive QUEUE -yes" (and
// purge) on SQS is the broker's own redrive (purge) of every dead letter,
// which moves at most 10 letters a receive and takes minutes on a large
// dead-letter queue; its bar showed nothing until it ended (one final
// count), where every other path shows the running count after each page.
// It now draws the count after each page, and the final report is the
// same exact count.
func TestOnSQSProgressOfAll(t *testing.T) {
	defer func(d time.Duration) { barThrottle = d }(barThrottle)
	barThrottle = 0 // draw every count the change reports
	const n = 25
	onTerminal := func(u string, args ...string) result {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"-url", u}, args...), env{
			stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, progress: true,
			getenv: func(string) string { return "" }, open: openURL,
		})
		return result{out.String(), errOut.String(), code}
	}
	for _, tc := range []struct{ verb, done string }{{"redrive", "redriven"}, {"purge", "purged"}} {
		t.Run(tc.verb, func(t *testing.T) {
			u, queue, _, _ := sqsDeadLettered(t, n)
			r := onTerminal(u, "dlq", tc.verb, queue, "-yes")
			if r.code != exitOK || r.out != fmt.Sprintf("%s %d dead letter(s) of %s\n", tc.done, n, queue) {
				t.Fatalf("exit %d\nstdout %q\nstderr %q", r.code, r.out, r.err)
			}
			var counts []int
			for _, m := range barCount.FindAllStringSubmatch(r.err, -1) {
				k, _ := strconv.Atoi(m[1])
				counts = append(counts, k)
			}
			between := false
			for _, k := range counts {
				between = between || (k > 0 && k < n)
			}
			if !strings.Contains(r.err, tc.verb+" "+queue) || !between {
				t.Fatalf("the bar drew no count between 0 and %d while it ran (drew %v):\nstderr %q", n, counts, r.err)
			}
			ready := int64(0)
			if tc.verb == "redrive" {
				ready = n
			}
			statsAre(t, u, queue, ready, 0)
		})
	}
}

// TestOnSQSListStreams: a filtered "berth dlq list" (and a dry run's count)
// on SQS read up to -scan-limit whole dead letters in one ListDeadLetters
// call and kept them all in memory until the scan ended, to show a page of
// them; its "counting" line jumped from nothing to the end. dlq.List now
// takes them a receive at a time (StreamDeadLetters) and keeps only what it
// shows, while the scan still holds every letter it read invisible until it
// ends (so it reads none twice and sees further): another reader sees
// only those it has not read yet.
func TestOnSQSListStreams(t *testing.T) {
	const n = 25
	_, queue, b, _ := sqsDeadLettered(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var counts []int
	othersSaw := -1
	f := dlq.Filter{Types: []string{"billing.charge", "billing.refund"}}
	l, err := dlq.List(ctx, b, queue, f, 0, 3, dlq.Options{PageSize: 500, ScanLimit: 10000, Scanned: func(k int) {
		counts = append(counts, k)
		if othersSaw < 0 && k < n {
			// Mid-scan: the letters read so far are held invisible.
			ms, err := b.ListDeadLetters(ctx, queue, 100)
			if err != nil {
				t.Errorf("another reader's list: %v", err)
			}
			othersSaw = len(ms)
			if othersSaw != n-k {
				t.Errorf("another reader saw %d dead letters after the scan read %d of %d; want %d (those it read are held)", othersSaw, k, n, n-k)
			}
		}
	}})
	if err != nil || l.Matched != n || !l.Complete || len(l.Messages) != 3 || l.Next != 3 {
		t.Fatalf("List = %d shown, %d matched, complete %v, next %d, %v; want 3, %d, true, 3", len(l.Messages), l.Matched, l.Complete, l.Next, err, n)
	}
	if len(counts) < 3 || counts[0] > 10 || counts[len(counts)-1] != n || othersSaw < 0 {
		t.Fatalf("the scan reported %v read: want a count after each receive (at most 10 a page), ending at %d", counts, n)
	}
	for i := 1; i < len(counts); i++ {
		if d := counts[i] - counts[i-1]; d <= 0 || d > 10 {
			t.Fatalf("the scan reported %v read: want a count after each receive (at most 10 a page)", counts)
		}
	}
	// The scan made every letter visible again at its end.
	if ms, err := b.ListDeadLetters(ctx, queue, 100); err != nil || len(ms) != n {
		t.Fatalf("after the list: %d dead letters visible, %v; want %d", len(ms), err, n)
	}
}

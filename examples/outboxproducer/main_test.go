package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/berthtest/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun: the committed sign-ups' jobs reach the broker through the
// outbox, once each, with their keys; the refused one publishes nothing.
func TestRun(t *testing.T) {
	pool, schema := pgtest.Schema(t, 4)
	b := berthtest.Memory(t)
	var out bytes.Buffer
	if err := Run(context.Background(), pool, schema, b, []string{"a@example.com", "b@example.com", "a@example.com"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"signed up a@example.com", "signed up b@example.com",
		"sign-up a@example.com refused: email taken (rolled back, nothing published)",
		"broker delivered email.welcome to a@example.com (key welcome:1:v1)",
		"broker delivered email.welcome to b@example.com (key welcome:2:v1)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "broker delivered"); n != 2 {
		t.Errorf("%d deliveries, want 2:\n%s", n, got)
	}
	st, err := b.Stats(context.Background(), Queue)
	if err != nil || st.Ready+st.InFlight+st.Delayed != 0 {
		t.Errorf("queue left with %+v (%v)", st, err)
	}
}

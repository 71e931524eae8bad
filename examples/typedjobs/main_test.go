package main

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/berthq/berth/berthtest"
	"github.com/berthq/berth/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestHandlers: each typed handler through the Worker's settlement rules.
func TestHandlers(t *testing.T) {
	var mu sync.Mutex
	var did []string
	r := Router(&mu, &did)
	m, _ := sdk.NewJob(ResizeImage{ImageID: "img_1", Width: 640})
	if res := berthtest.Work(t, r, m); !res.Acked() || m.IdempotencyKey != "resize:img_1:640" {
		t.Fatalf("resize: %s (%v), key %q", res.Action, res.Cause, m.IdempotencyKey)
	}
	m, _ = sdk.NewJob(ResizeImage{ImageID: "img_2"})
	if res := berthtest.Work(t, r, m); !res.DeadLettered() || !errors.Is(res.Cause, ErrBadWidth) {
		t.Fatalf("zero width: %s (%v), want a dead letter", res.Action, res.Cause)
	}
	m, _ = sdk.NewJob(NotifyUser{UserID: "u_7", Text: "hi"})
	if res := berthtest.Work(t, r, m); !res.Acked() {
		t.Fatalf("notify: %s (%v)", res.Action, res.Cause)
	}
	if len(did) != 2 || did[0] != "resized img_1 to 640px" || did[1] != "notified u_7: hi" {
		t.Fatalf("handlers did %q", did)
	}
}

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	want := `notified u_7: your image is ready
resized img_1 to 640px
image.resize: ack
image.resize: dead_letter
user.notify: ack
`
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

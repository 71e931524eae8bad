// Command typedjobs is a Worker of typed jobs on the in-memory broker, with
// no service to start: each payload type names its job type (sdk.JobArgs),
// producers create messages from values (sdk.NewJob) and handlers are
// registered for the type they decode (sdk.HandleJob).
//
//	go run ./examples/typedjobs
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/sdk"
)

// Queue holds both job types.
const Queue = "jobs"

// ResizeImage is one job type.
type ResizeImage struct {
	ImageID string `json:"image_id"`
	Width   int    `json:"width"`
}

// Kind names the job type.
func (ResizeImage) Kind() string { return "image.resize" }

// IdempotencyKey names the business operation.
func (r ResizeImage) IdempotencyKey() string { return fmt.Sprintf("resize:%s:%d", r.ImageID, r.Width) }

// NotifyUser is another.
type NotifyUser struct {
	UserID string `json:"user_id"`
	Text   string `json:"text"`
}

// Kind names the job type.
func (NotifyUser) Kind() string { return "user.notify" }

// ErrBadWidth is the resize handler's permanent failure.
var ErrBadWidth = errors.New("width must be positive")

func main() {
	if err := Run(context.Background(), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// Router registers a handler per job type; each handler writes what it did
// to log, under mu.
func Router(mu *sync.Mutex, log *[]string) *sdk.Router {
	r := sdk.NewRouter()
	sdk.HandleJob(r, func(ctx context.Context, j sdk.Job[ResizeImage]) error {
		if j.Args.Width <= 0 {
			return sdk.Permanent(fmt.Errorf("resize %s: %w", j.Args.ImageID, ErrBadWidth))
		}
		mu.Lock()
		defer mu.Unlock()
		*log = append(*log, fmt.Sprintf("resized %s to %dpx", j.Args.ImageID, j.Args.Width))
		return nil
	})
	sdk.HandleJob(r, func(ctx context.Context, j sdk.Job[NotifyUser]) error {
		mu.Lock()
		defer mu.Unlock()
		*log = append(*log, fmt.Sprintf("notified %s: %s", j.Args.UserID, j.Args.Text))
		return nil
	})
	return r
}

// Run publishes a few typed jobs, one of them invalid, processes them and
// prints what happened.
func Run(ctx context.Context, out io.Writer) error {
	b, err := memory.New(memory.Options{})
	if err != nil {
		return err
	}
	defer b.Close()
	var mu sync.Mutex
	var did []string
	done := make(chan struct{})
	var settled []string
	count := settledFunc(func(d sdk.Delivery, s sdk.Settlement) {
		mu.Lock()
		defer mu.Unlock()
		settled = append(settled, fmt.Sprintf("%s: %s", d.Message().Type, s.Action))
		if len(settled) == 3 {
			close(done)
		}
	})
	w, err := sdk.NewWorker(b, Router(&mu, &did), sdk.WorkerOptions{Queue: Queue, Observers: []sdk.Observer{count}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	for _, args := range []sdk.JobArgs{
		ResizeImage{ImageID: "img_1", Width: 640},
		NotifyUser{UserID: "u_7", Text: "your image is ready"},
		ResizeImage{ImageID: "img_2", Width: 0},
	} {
		m, err := sdk.NewJob(args)
		if err != nil {
			return err
		}
		if err := b.Publish(ctx, Queue, m); err != nil {
			return err
		}
	}
	wctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(wctx) }()
	var timeout error
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		timeout = errors.New("typedjobs: not every job settled within 30s")
	}
	stop()
	if err := errors.Join(<-ran, timeout); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Strings(did)
	sort.Strings(settled)
	for _, s := range append(did, settled...) {
		fmt.Fprintln(out, s)
	}
	return nil
}

// settledFunc is an sdk.Observer calling itself with each settlement.
type settledFunc func(sdk.Delivery, sdk.Settlement)

func (f settledFunc) Start(ctx context.Context, _ sdk.Delivery) context.Context { return ctx }

func (f settledFunc) Settled(_ context.Context, d sdk.Delivery, s sdk.Settlement) { f(d, s) }

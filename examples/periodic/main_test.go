package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berthq/berth/periodic"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The example over a minute of simulated time: 60 slots, each published by
// the three replicas and applied once.
func TestExampleAppliesEachSlotOnce(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 500_000_000, time.UTC)
	clock := periodic.NewFakeClock(t0)
	a, err := start(clock, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 120 {
		if err := clock.WaitSleepers(ctx, replicas); err != nil {
			t.Fatal(err)
		}
		clock.Advance(500 * time.Millisecond)
	}
	if err := clock.WaitSleepers(ctx, replicas); err != nil {
		t.Fatal(err)
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	a.report(&out)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 61 {
		t.Fatalf("%d lines, want 60 slots and a summary:\n%s", len(lines), out.String())
	}
	for i, l := range lines[:60] {
		want := fmt.Sprintf("slot %s: published 3×, applied 1×", t0.Add(time.Duration(i+1)*time.Second).Truncate(time.Second).Format(time.TimeOnly))
		if l != want {
			t.Errorf("line %d = %q, want %q", i, l, want)
		}
	}
	if want := "60 slots, 180 publishes by 3 replicas, 60 rollups applied"; lines[60] != want {
		t.Errorf("summary %q, want %q", lines[60], want)
	}
}

package main

import (
	"context"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs the example's flow end to end: every delivery settles and the
// metrics are collected.
func TestRun(t *testing.T) {
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

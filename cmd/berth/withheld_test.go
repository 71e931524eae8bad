package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/sdk"
)

// "berth dlq redrive billing [-type billing.charge] -limit 2 -yes" on a
// terminal, where -limit chooses a letter holding dup and own, and another
// letter (not chosen) holds dup too: the change leaves dup and redrives
// own. Its bar counts the letters it moves, as after a confirmation: it
// ends at 1/1. Before, with -yes its total was -limit, the letter left
// included: it ended at 1/2.
func TestYesLimitBarLeavesWithheldOut(t *testing.T) {
	defer func(d time.Duration) { barThrottle = d }(barThrottle)
	barThrottle = 0
	for _, tc := range []struct {
		name    string
		letters []*sdk.Message
		args    []string
	}{
		{"filter", []*sdk.Message{{ID: "dup", Type: "billing.charge"}, {ID: "dup", Type: "billing.refund"}, {ID: "own", Type: "billing.charge"}},
			[]string{"-type", "billing.charge"}},
		{"limit alone", []*sdk.Message{{ID: "dup", Type: "billing.charge"}, {ID: "own", Type: "billing.charge"}, {ID: "dup", Type: "billing.charge"}},
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := lettered(t, tc.letters...)
			args := append([]string{"dlq", "redrive", "billing", "-limit", "2", "-yes"}, tc.args...)
			r := berthEnv(t, context.Background(), b, env{progress: true}, args...)
			if r.code != exitPartial || !strings.Contains(r.out, "redriven 1 dead letter(s) of billing") || !strings.Contains(r.out, "not redriven: dup: dead letters the change did not choose") {
				t.Fatalf("exit %d:\n%s%s", r.code, r.out, r.err)
			}
			if m := barCount.FindAllStringSubmatch(r.err, -1); len(m) == 0 || m[len(m)-1][1] != "1" || m[len(m)-1][2] != "1" {
				t.Errorf("the bar's last count: %v; want 1/1:\n%q", m, r.err)
			}
		})
	}
}

// A change chosen by a filter that a broker error stops part-way names the
// IDs it had held back by then (shared with letters it had not chosen), in
// the text and in -json's failed, apart from the letters it never reached.
// Before, it named none: with nothing redriven it printed only the error;
// after a page, only the count.
func TestStoppedChangeNamesWithheldIDs(t *testing.T) {
	const why = "not redriven: dup: dead letters the change did not choose hold this ID too: 2 dead letters hold this ID and only 1 of them had been chosen when the change stopped"
	for _, tc := range []struct {
		name     string
		letters  []*sdk.Message
		script   []string
		done     int
		code     int
		pageSize string
	}{
		// Pages of 2: [dup, own] redrives own and holds dup back; the
		// second page's redrive fails.
		{"after a page", []*sdk.Message{{ID: "dup", Type: "billing.charge"}, {ID: "own", Type: "billing.charge"},
			{ID: "other", Type: "billing.charge"}, {ID: "dup", Type: "billing.refund"}}, []string{"ok"}, 1, exitPartial, "2"},
		// Pages of 1: [dup] is held back; [other]'s redrive fails.
		{"nothing redriven", []*sdk.Message{{ID: "dup", Type: "billing.charge"}, {ID: "other", Type: "billing.charge"},
			{ID: "dup", Type: "billing.refund"}}, nil, 0, exitError, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, asJSON := range []bool{false, true} {
				b := lettered(t, tc.letters...)
				sb := &scriptedRedrive{Broker: b, script: tc.script}
				args := []string{"dlq", "redrive", "billing", "-type", "billing.charge", "-yes", "-page-size", tc.pageSize}
				if asJSON {
					args = append(args, "-json")
				}
				r := berthEnv(t, context.Background(), b, env{open: func(context.Context, string) (sdk.Broker, error) { return sb, nil }}, args...)
				if r.code != tc.code || !strings.Contains(r.err, "connection") {
					t.Errorf("json %v: exit %d, want %d:\n%s%s", asJSON, r.code, tc.code, r.out, r.err)
				}
				if !asJSON {
					if !strings.Contains(r.out, fmt.Sprintf("redriven %d dead letter(s) of billing before the error", tc.done)) || !strings.Contains(r.out, why) {
						t.Errorf("the report does not name dup:\n%s", r.out)
					}
					if strings.Contains(r.out, "more not redriven") {
						t.Errorf("the report counts letters it named as more:\n%s", r.out)
					}
					continue
				}
				var doc struct {
					Done, Missed int
					Failed       []jsonFailure
					Error        string
				}
				if err := json.Unmarshal([]byte(strings.TrimSpace(r.out)), &doc); err != nil {
					t.Fatalf("-json: stdout %q is not the JSON document: %v", r.out, err)
				}
				if doc.Done != tc.done || doc.Missed != 1 || len(doc.Failed) != 1 || doc.Failed[0].ID != "dup" || !strings.Contains("not redriven: dup: "+doc.Failed[0].Error, why) || !strings.Contains(doc.Error, "connection") {
					t.Errorf("-json: %+v", doc)
				}
			}
		})
	}
}

// A letter named counts once: dup's two chosen letters, held back (a
// third, not chosen, holds dup too), are named once, and the report does
// not add "… and 1 more" as if another, unnamed letter was left. Before,
// the line counted the letters missed less the IDs named.
func TestReportCountsNamedLettersOnce(t *testing.T) {
	b := lettered(t, &sdk.Message{ID: "dup", Type: "billing.charge"}, &sdk.Message{ID: "dup", Type: "billing.charge"},
		&sdk.Message{ID: "dup", Type: "billing.refund"}, &sdk.Message{ID: "own", Type: "billing.charge"})
	r := berth(t, b, "dlq", "redrive", "billing", "-type", "billing.charge", "-yes")
	if r.code != exitPartial || !strings.Contains(r.out, "redriven 1 dead letter(s)") || !strings.Contains(r.out, "not redriven: dup: ") ||
		!strings.Contains(r.err, "2 of the chosen dead letters were not redriven") {
		t.Fatalf("exit %d:\n%s%s", r.code, r.out, r.err)
	}
	if strings.Contains(r.out, "more not redriven") {
		t.Errorf("the report counts the letters of dup, named, as more:\n%s", r.out)
	}
}

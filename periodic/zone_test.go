package periodic_test

import (
	"slices"
	"testing"
	"time"

	"github.com/berthq/berth/periodic"
)

// In Asia/Beirut the clocks go from 00:00 to 01:00 on the last Sunday of
// March: midnight does not exist that day. robfig/cron's day search
// normalised that missing midnight back into Saturday and stepped over the
// Sunday, so a scheduler running since the week before published no slot
// of a weekly Sunday job that day (a scheduler started that morning did:
// schedulers disagreed, and the slot was lost where all ran through it).
func TestWeeklySlotOnMidnightDSTDayIsPublished(t *testing.T) {
	beirut, err := time.LoadLocation("Asia/Beirut")
	if err != nil {
		t.Skip(err)
	}
	sched := periodic.MustCron("CRON_TZ=Asia/Beirut 0 12 * * 0")
	start := time.Date(2026, 3, 22, 13, 0, 0, 0, beirut) // the Sunday before, after its slot
	c := periodic.NewFakeClock(start)
	pub := &keyRecorder{}
	s, err := periodic.New(pub, periodic.Options{Clock: c}, periodic.Job{Name: "weekly", Schedule: sched, Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	steps := make([]time.Duration, 14*24) // two weeks, an hour at a time
	for i := range steps {
		steps[i] = time.Hour
	}
	drive(t, s, c, steps...)
	want := []string{
		time.Date(2026, 3, 29, 12, 0, 0, 0, beirut).UTC().Format(time.RFC3339Nano), // the DST Sunday
		time.Date(2026, 4, 5, 12, 0, 0, 0, beirut).UTC().Format(time.RFC3339Nano),
	}
	if !slices.Equal(pub.slots, want) {
		t.Errorf("published slots %v, want %v", pub.slots, want)
	}
}

// A cron schedule names the same slots whatever time it is asked from:
// Next(t) is the first slot of the walk from long before that is after t.
// robfig/cron broke this around DST changes at midnight (Asia/Beirut,
// America/Asuncion) and changes that are not one hour (Australia/Lord_Howe:
// 30 min; Antarctica/Troll: 2 h) or fall back to a time before the change's
// hour (Pacific/Chatham), by skipping a day, naming a slot on the wrong day
// or returning a time before t: schedulers started at different times
// published different slots (different keys: run twice, or lost), and one
// whose Next went back had its job stopped.
func TestCronSlotsDoNotDependOnWhenAsked(t *testing.T) {
	cases := []struct{ zone, expr string }{
		{"Asia/Beirut", "0 12 * * 0"},
		{"America/Asuncion", "0 2 1 * *"},
		{"Australia/Lord_Howe", "0 0 * * *"},
		{"Australia/Lord_Howe", "0 1 * * *"},
		{"Pacific/Chatham", "0 3 * * *"},
		{"Antarctica/Troll", "30 1 * * *"},
		{"Antarctica/Troll", "0 2 * * *"},
		{"America/New_York", "30 1 * * *"}, // repeated in autumn: two slots
		{"America/New_York", "30 2 * * *"}, // skipped in spring: none
		{"Europe/Paris", "*/20 * * * *"},
		{"UTC", "0 0 29 2 *"},
	}
	for _, tc := range cases {
		loc, err := time.LoadLocation(tc.zone)
		if err != nil {
			t.Fatal(err)
		}
		s := periodic.MustCron("CRON_TZ=" + tc.zone + " " + tc.expr)
		// The zone's changes of offset in 2022–2026 (all of them for the
		// leap day), ±2 days around each.
		var around []time.Time
		for h := time.Date(2022, 1, 1, 0, 0, 0, 0, time.UTC); h.Year() < 2027; h = h.Add(time.Hour) {
			_, o1 := h.In(loc).Zone()
			_, o2 := h.Add(time.Hour).In(loc).Zone()
			if o1 != o2 || (tc.zone == "UTC" && h.Month() == 2 && h.Day() == 28 && h.Hour() == 0) {
				around = append(around, h)
			}
		}
		for _, tr := range around {
			from, to := tr.Add(-48*time.Hour), tr.Add(48*time.Hour)
			var walk []time.Time
			for n := s.Next(from); ; n = s.Next(n) {
				if n.IsZero() {
					t.Fatalf("%s %q: no slot after %s", tc.zone, tc.expr, from)
				}
				walk = append(walk, n)
				if n.After(to) {
					break
				}
			}
			for i := 1; i < len(walk); i++ {
				if !walk[i].After(walk[i-1]) {
					t.Fatalf("%s %q: slot %s after %s", tc.zone, tc.expr, walk[i].In(loc), walk[i-1].In(loc))
				}
			}
			// The slots are the instants whose wall time the expression
			// names (both of a time repeated, none of a time skipped).
			utc := periodic.MustCron(tc.expr)
			var want, got []time.Time
			for at := from.Truncate(time.Minute).Add(time.Minute); !at.After(to); at = at.Add(time.Minute) {
				l := at.In(loc)
				w := time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), 0, time.UTC)
				if utc.Next(w.Add(-time.Second)).Equal(w) {
					want = append(want, at)
				}
			}
			for _, n := range walk {
				if !n.After(to) {
					got = append(got, n)
				}
			}
			if !slices.EqualFunc(got, want, time.Time.Equal) {
				t.Errorf("%s %q: slots %v, want %v", tc.zone, tc.expr, got, want)
			}
			i := 0
			for at := from; at.Before(to); at = at.Add(7 * time.Minute) {
				for !walk[i].After(at) {
					i++
				}
				if n := s.Next(at); !n.Equal(walk[i]) {
					t.Errorf("%s %q: Next(%s) = %s, but the first slot after it is %s",
						tc.zone, tc.expr, at.In(loc), n.In(loc), walk[i].In(loc))
					break
				}
			}
		}
	}
}

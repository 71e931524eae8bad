package periodic

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Schedule names the slots of a periodic job: Next returns the first slot
// strictly after t, or the zero time when there is none (the job is then
// done). Every scheduler of a job must compute the same slots, so a Schedule
// depends on t alone, never on when it was created.
//
// A Next that returns a non-zero time not after t (t itself, or an earlier
// time) breaks this contract: it would name the same slot for ever. The
// [Scheduler] stops such a job at the first broken answer, logging it at
// Error with an error wrapping [ErrInvalidSchedule]; the slots it had already
// found due are still published, and the other jobs go on.
type Schedule interface {
	Next(t time.Time) time.Time
}

// ErrInvalidSchedule reports a cron expression or interval that cannot be
// used.
var ErrInvalidSchedule = errors.New("berth/periodic: invalid schedule")

// parser accepts the standard five cron fields (minute hour day-of-month
// month day-of-week) with an optional leading seconds field, the
// descriptors (@hourly, @daily, @every 90s, …) and a CRON_TZ=/TZ= prefix.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Cron parses a cron expression with github.com/robfig/cron/v3: five fields
// ("*/5 * * * *"), or six with seconds first ("*/10 * * * * *"),
// descriptors ("@hourly", "@daily"), and a time zone prefix
// ("CRON_TZ=Europe/Paris 0 9 * * *"; the default zone is UTC, not the
// machine's, so schedulers on machines with different zones agree).
//
// "@every d" is refused, with or without a time zone prefix: robfig counts
// it from the time it is asked, so two schedulers would disagree on the
// slots; use [Every], which aligns slots to the Unix epoch.
//
// In a zone with daylight saving time, the slots follow the wall clock —
// they are the instants whose wall time the expression names, whatever the
// size or the hour of the change (robfig's own search, which skipped the
// Sunday whose midnight Asia/Beirut skips, is not used for it):
// a time in the hour repeated in autumn ("CRON_TZ=America/New_York 30 1 * *
// *") gives two slots that day, with different [SlotKey]s, so the job runs
// twice; a time in the hour skipped in spring (2:30 there) gives none. Keep
// such schedules in UTC, or outside the changeover hours, when once a day
// must mean once.
//
// The zone must be named: "CRON_TZ=Local" is refused, since the machine's
// zone may differ between the schedulers of one job.
//
// An expression that names no slot at all ("0 0 30 2 *", February 30th)
// is refused too, rather than giving a job that never runs.
func Cron(expr string) (Schedule, error) {
	if strings.HasPrefix(cronSpec(expr), "@every") {
		// Checked as robfig reads the expression (trimmed, after a time
		// zone prefix): "CRON_TZ=UTC @every 1m" or " @every 1m" must not
		// get through.
		return nil, fmt.Errorf("%w: %q: use periodic.Every for fixed intervals (slots aligned to the epoch)", ErrInvalidSchedule, expr)
	}
	expr = strings.TrimSpace(expr)
	if !hasTZ(expr) {
		expr = "CRON_TZ=UTC " + expr
	} else if !strings.Contains(expr, " ") {
		// robfig slices the zone up to the first space and panics
		// without one ("CRON_TZ=Europe/Paris" alone).
		return nil, fmt.Errorf("%w: %q: a time zone without a schedule", ErrInvalidSchedule, expr)
	}
	s, err := parser.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrInvalidSchedule, expr, err)
	}
	if spec, ok := s.(*cron.SpecSchedule); ok && spec.Location == time.Local {
		// "Local" names no zone: robfig then reads the fields in the zone
		// of the time it is asked about (the machine's, from RealClock),
		// so schedulers in different zones would name different slots.
		return nil, fmt.Errorf("%w: %q: the time zone \"Local\" is the machine's; name the zone", ErrInvalidSchedule, expr)
	}
	if spec, ok := s.(*cron.SpecSchedule); ok && spec.Location != time.UTC {
		w := *spec
		w.Location = time.UTC
		s = zoned{wall: &w, loc: spec.Location}
	}
	// robfig's Next looks five years ahead, which holds every date a
	// valid expression can name (February 29th included): none from the
	// epoch means none ever.
	if s.Next(time.Unix(0, 0)).IsZero() {
		return nil, fmt.Errorf("%w: %q: the expression names no time (a day the month never has)", ErrInvalidSchedule, expr)
	}
	return s, nil
}

// cronSpec is expr as robfig's parser reads it: trimmed, without its time
// zone prefix.
func cronSpec(expr string) string {
	s := strings.TrimSpace(expr)
	if hasTZ(s) {
		i := strings.IndexAny(s, " \t")
		if i < 0 {
			return ""
		}
		s = strings.TrimSpace(s[i:])
	}
	return s
}

func hasTZ(expr string) bool {
	for _, p := range []string{"CRON_TZ=", "TZ="} {
		if len(expr) >= len(p) && expr[:len(p)] == p {
			return true
		}
	}
	return false
}

// MustCron is [Cron] that panics on an invalid expression, for schedules
// written in the program.
func MustCron(expr string) Schedule {
	s, err := Cron(expr)
	if err != nil {
		panic(err)
	}
	return s
}

// Every returns a fixed-interval schedule whose slots are the multiples of
// d since the Unix epoch (plus offset, for slots not on round times): every
// scheduler computes the same slots whenever it starts. d must be at least a
// second and at most [MaxEvery], and offset in [0, d).
func Every(d, offset time.Duration) (Schedule, error) {
	if d < time.Second || d > MaxEvery || offset < 0 || offset >= d {
		return nil, fmt.Errorf("%w: every %s offset %s: the interval must be from 1s to %s and the offset in [0, interval)",
			ErrInvalidSchedule, d, offset, MaxEvery)
	}
	return every{d: int64(d), off: int64(offset)}, nil
}

// MaxEvery bounds the interval of [Every]: slots are computed in
// nanoseconds since 1970, which a longer interval plus its offset would
// overflow (the job then stopped at run time instead of being refused).
const MaxEvery = 100 * 365 * 24 * time.Hour

type every struct{ d, off int64 }

func (e every) Next(t time.Time) time.Time {
	n := t.UnixNano() - e.off
	q := n / e.d
	if n < 0 && n%e.d != 0 {
		q-- // floor division for times before the epoch
	}
	return time.Unix(0, (q+1)*e.d+e.off).UTC()
}

// zoned is a cron schedule read in a zone other than UTC. robfig's own Next
// walks the zone's wall clock with time.Date and hour corrections that
// assume offset changes of one hour away from midnight: where midnight is
// skipped (Asia/Beirut) it stepped over that whole day, and where a change
// is not one hour (Australia/Lord_Howe, Antarctica/Troll) or falls back
// across the hour (Pacific/Chatham) it skipped slots, named one on the wrong
// day or one before the time asked — and schedulers started at different
// times disagreed on the slots. zoned walks the wall clock as if it were UTC,
// where robfig is exact, and maps each wall time to the instants that show
// it: none in a gap (spring), two in an overlap (autumn).
type zoned struct {
	wall *cron.SpecSchedule // the expression's fields, in UTC
	loc  *time.Location
}

// offsetWindow covers the instants that show a wall time and the largest
// change of offset (−12h to +14h): an offset sampled this far either side
// of a time is one of those that apply around it.
const offsetWindow = 27 * time.Hour

// offsets returns the zone's offsets (seconds) at u and offsetWindow either
// side, the smallest first.
func (z zoned) offsets(u time.Time) [3]int {
	var o [3]int
	for i, d := range [3]time.Duration{-offsetWindow, 0, offsetWindow} {
		_, o[i] = u.Add(d).In(z.loc).Zone()
	}
	if o[0] > o[1] {
		o[0], o[1] = o[1], o[0]
	}
	if o[1] > o[2] {
		o[1], o[2] = o[2], o[1]
	}
	if o[0] > o[1] {
		o[0], o[1] = o[1], o[0]
	}
	return o
}

// Next returns the first instant after t whose wall time in the zone the
// expression names, or the zero time when robfig finds no wall time (none
// in five years).
func (z zoned) Next(t time.Time) time.Time {
	// An instant i after t shows the wall time i+offset(i), after t plus
	// the smallest offset around: start the wall clock search there.
	w := t.UTC().Add(time.Duration(z.offsets(t)[0]) * time.Second)
	var best time.Time
	for {
		if w = z.wall.Next(w); w.IsZero() {
			break
		}
		offs := z.offsets(w)
		if !best.IsZero() && w.Add(-time.Duration(offs[2])*time.Second).After(best) {
			break // this wall time and the later ones show after best
		}
		for _, o := range offs {
			i := w.Add(-time.Duration(o) * time.Second)
			if _, got := i.In(z.loc).Zone(); got == o && i.After(t) && (best.IsZero() || i.Before(best)) {
				best = i
			}
		}
	}
	if best.IsZero() {
		return best
	}
	return best.In(t.Location()) // as robfig does
}

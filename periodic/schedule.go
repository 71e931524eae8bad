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
// In a zone with daylight saving time, robfig's slots follow the wall clock:
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

package periodic

import (
	"errors"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
)

// Schedule names the slots of a periodic job: Next returns the first slot
// strictly after t. Every scheduler of a job must compute the same slots, so
// a Schedule depends on t alone, never on when it was created.
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
// "@every d" is refused: robfig counts it from the time it is asked, so two
// schedulers would disagree on the slots; use [Every], which aligns slots to
// the Unix epoch.
func Cron(expr string) (Schedule, error) {
	if len(expr) >= len("@every") && expr[:len("@every")] == "@every" {
		return nil, fmt.Errorf("%w: %q: use periodic.Every for fixed intervals (slots aligned to the epoch)", ErrInvalidSchedule, expr)
	}
	if !hasTZ(expr) {
		expr = "CRON_TZ=UTC " + expr
	}
	s, err := parser.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrInvalidSchedule, expr, err)
	}
	return s, nil
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
// second and offset in [0, d).
func Every(d, offset time.Duration) (Schedule, error) {
	if d < time.Second || offset < 0 || offset >= d {
		return nil, fmt.Errorf("%w: every %s offset %s: the interval must be at least 1s and the offset in [0, interval)", ErrInvalidSchedule, d, offset)
	}
	return every{d: int64(d), off: int64(offset)}, nil
}

type every struct{ d, off int64 }

func (e every) Next(t time.Time) time.Time {
	n := t.UnixNano() - e.off
	q := n / e.d
	if n < 0 && n%e.d != 0 {
		q-- // floor division for times before the epoch
	}
	return time.Unix(0, (q+1)*e.d+e.off).UTC()
}

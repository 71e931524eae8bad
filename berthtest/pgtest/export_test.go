package pgtest

import "time"

// SetExecTimeout sets Exec's bound until the returned func restores it.
func SetExecTimeout(d time.Duration) (restore func()) {
	saved := execTimeout
	execTimeout = d
	return func() { execTimeout = saved }
}

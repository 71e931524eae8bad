// Package notfound makes the "not found" sentinels of berth's packages: each
// package keeps its own sentinel (so errors.Is(err, rowlock.ErrNotFound) keeps
// working and its text names the package), and every one of them also
// matches [sdk.ErrNotFound], so that one check classifies a missing row, key,
// queue or dead letter wherever it came from (ARCHITECTURE.md, "Error
// classes").
package notfound

import "github.com/berthq/berth/sdk"

// sentinel is a distinct error value that errors.Is sdk.ErrNotFound.
type sentinel struct{ msg string }

func (e *sentinel) Error() string { return e.msg }

// Is reports whether target is sdk.ErrNotFound; errors.Is compares the
// sentinel itself by identity before asking.
func (e *sentinel) Is(target error) bool { return target == sdk.ErrNotFound }

// New returns a new sentinel with text msg that matches [sdk.ErrNotFound].
func New(msg string) error { return &sentinel{msg: msg} }

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// The grammar is one flag set per invocation holding the global flags and
// every command's flags, parsed with flags allowed anywhere (before, between
// or after the command and its arguments; "--" ends the flags). Then the
// command named by the first arguments checks that every flag given is one
// of its own. The standard flag package does the parsing; this file only
// lets flags and arguments interleave, which is all the CLI needed from a
// library such as cobra or pflag (and their GNU-style double-dash syntax
// would have changed the documented -flag spelling).

// usageError is a command line the CLI cannot run; it exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// parseInterspersed parses args with fs, allowing flags after positional
// arguments, and returns the positional arguments in order. A -h, -help or
// --help anywhere sets help instead of failing.
func parseInterspersed(fs *flag.FlagSet, args []string) (pos []string, help bool, err error) {
	var rest []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, rest = args[:i], args[i+1:]
	}
	var kept []string
	for _, a := range args {
		switch a {
		case "-h", "-help", "--help":
			help = true
		default:
			kept = append(kept, a)
		}
	}
	args = kept
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return pos, true, nil
			}
			return pos, help, &usageError{err.Error()}
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return append(pos, rest...), help, nil
}

// flagsGiven returns the names of the flags set on the command line.
func flagsGiven(fs *flag.FlagSet) []string {
	var names []string
	fs.Visit(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// printFlags prints the named flags of fs, as flag.PrintDefaults does.
func printFlags(w io.Writer, fs *flag.FlagSet, names []string) {
	sub := flag.NewFlagSet("", flag.ContinueOnError)
	sub.SetOutput(w)
	for _, n := range names {
		if f := fs.Lookup(n); f != nil {
			sub.Var(f.Value, f.Name, f.Usage)
			sub.Lookup(n).DefValue = f.DefValue
		}
	}
	sub.PrintDefaults()
}

func joinWords(ws []string) string { return strings.Join(ws, " ") }

package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cleveragents/locks/domain"
)

// The exit codes of agents. Scripts depend on them: never renumber one.
const (
	exitOK       = 0 // success; for diagnostics: no check failed
	exitFailure  = 1 // anything unexpected (an unreadable database, ...); for diagnostics: a check failed
	exitUsage    = 2 // a usage or validation error; nothing was read or written
	exitConflict = 3 // another owner holds an active lock on the resource
	exitExpired  = 4 // renew: the owner's lock has expired, or the owner holds none; run: the lock was lost while CMD ran

	// Codes of "locks run" alone, as shells and env(1) use them. Any other
	// code of run is its command's own.
	exitCannotRun = 126 // run: CMD was found but could not be started
	exitNotFound  = 127 // run: CMD was not found
)

// exitCodes is the one table from errors to exit codes, and to the code of
// the JSON error document. The first row whose error matches (errors.Is)
// wins; an error that matches no row is internal.
var exitCodes = []struct {
	err  error
	exit int
	code string
}{
	{domain.ErrConflict, exitConflict, "conflict"},
	{domain.ErrExpired, exitExpired, "expired"},
	{domain.ErrValidation, exitUsage, "validation"},
	{errUsage, exitUsage, "validation"},
	{errChecksFailed, exitFailure, "internal"},
	{errNoStore, exitFailure, "no_database"},
	{domain.ErrUnavailable, exitFailure, "internal"},
	{errNotFound, exitNotFound, "not_found"},
	{errCannotRun, exitCannotRun, "cannot_run"},
}

func exitCode(err error) (exit int, code string) {
	for _, row := range exitCodes {
		if errors.Is(err, row.err) {
			return row.exit, row.code
		}
	}
	return exitFailure, "internal"
}

// errUsage matches every error in the use of the command line: an unknown
// command or flag, a missing argument or owner, a malformed TTL.
var errUsage = errors.New("usage error")

type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// Is makes errors.Is(err, errUsage) true.
func (e *usageError) Is(target error) bool { return target == errUsage }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errNotFound and errCannotRun match the commands that "locks run" could not
// find, or could not start.
var (
	errNotFound  = errors.New("command not found")
	errCannotRun = errors.New("command cannot be run")
)

// exitStatus ends agents with a code and prints nothing more: the status of
// the command that "locks run" ran, reported already.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// parseExitCode reads the value of --conflict-exit-code (conflict) or
// --lost-exit-code. The codes that agents gives other outcomes of "locks
// run" are refused, so that a script can still tell them apart: 1 and 2
// (a failure, a usage error), 126 and 127 (CMD could not be started, was
// not found). 0 is allowed for a conflict only (flock -E 0: skip the run
// quietly when another one holds the lock); a lost lock must never look
// like success.
func parseExitCode(s string, conflict bool) (int, error) {
	n, err := strconv.Atoi(s)
	switch {
	case err != nil || n < 0 || n > 255:
		return 0, errors.New("an exit code is a whole number from 0 to 255")
	case n == 0 && !conflict:
		return 0, errors.New("a lost lock must not exit 0, which says that all went well")
	case n == exitFailure || n == exitUsage || n == exitCannotRun || n == exitNotFound:
		return 0, fmt.Errorf("agents exits %d for another failure already (see agents -h)", n)
	}
	return n, nil
}

// codedError is an error for which "locks run" exits with a code of the
// user's choosing (--conflict-exit-code) rather than the table's.
type codedError struct {
	error
	exit int
}

func (e *codedError) Unwrap() error { return e.error }

// cobraError is an error in the command line that cobra or pflag found (an
// unknown command or flag, a flag without its value, a value that its flag
// refused): a usage error, in their words.
type cobraError struct{ err error }

func (e *cobraError) Error() string { return e.err.Error() }

// cobraLine puts the text of a *cobraError on one line, for the JSON
// message: cobra's suggestions ("\n\nDid you mean this?\n\tacquire\n")
// become one readable clause, `; did you mean "acquire"?`.
func cobraLine(text string) string {
	const did = "\n\nDid you mean this?\n"
	msg, suggestions, found := strings.Cut(text, did)
	if !found {
		return oneLine(strings.TrimRight(msg, "\n"))
	}
	var names []string
	for _, s := range strings.Split(suggestions, "\n") {
		if s = strings.TrimSpace(s); s != "" {
			names = append(names, strconv.Quote(s))
		}
	}
	msg = oneLine(strings.TrimRight(msg, "\n"))
	switch len(names) {
	case 0:
		return msg
	case 1:
		return fmt.Sprintf("%s; did you mean %s?", msg, names[0])
	default:
		return fmt.Sprintf("%s; did you mean %s or %s?", msg, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
	}
}

func (e *cobraError) Unwrap() error { return e.err }

// Is makes errors.Is(err, errUsage) true.
func (e *cobraError) Is(target error) bool { return target == errUsage }

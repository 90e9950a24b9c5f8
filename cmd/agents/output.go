package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/cleveragents/locks/domain"
)

// jsonTime writes instants in JSON output: ISO-8601 in UTC, at the
// microsecond precision the service records, always the same width.
const jsonTime = "2006-01-02T15:04:05.000000Z07:00"

// humanTime writes instants in human output, in local time.
const humanTime = "2006-01-02 15:04:05 MST"

// countDoc is a count in JSON output.
type countDoc struct {
	Count int `json:"count"`
}

// errorDoc is the body of the JSON document of a failure.
type errorDoc struct {
	Code    string   `json:"code"`
	Message string   `json:"message"`
	Holder  *lockDoc `json:"holder,omitempty"`
	// WaitedSeconds is how long a --wait waited before it gave up, to the
	// millisecond; absent when the command did not wait.
	WaitedSeconds *float64 `json:"waited_seconds,omitempty"`
	// Reason tells the failures of code "expired" apart (renew): see
	// expiredReason.
	Reason string `json:"reason,omitempty"`
	// ExpiredAt is when the owner's lock expired, for reason "expired".
	ExpiredAt string `json:"expired_at,omitempty"`
}

// The reasons of an "expired" failure of renew. Scripts tell "my lock ran
// out" from "I never held it" (a wrong owner or resource) by them.
const (
	reasonExpired = "expired"  // the owner's lock expired; expired_at says when
	reasonNotHeld = "not_held" // the owner holds no lock on the resource, expired or not
	reasonTooSlow = "too_slow" // the store wrote the lock only after its TTL had passed
)

// expiredReason describes a *domain.LockExpiredError for the JSON error
// document.
func expiredReason(e *domain.LockExpiredError) (reason, expiredAt string) {
	switch {
	case !e.WrittenAt.IsZero():
		return reasonTooSlow, e.ExpiredAt.UTC().Format(jsonTime)
	case e.ExpiredAt.IsZero():
		return reasonNotHeld, ""
	}
	return reasonExpired, e.ExpiredAt.UTC().Format(jsonTime)
}

// emit writes a command's result: v as the one JSON document with --json,
// else what human writes. A human writer need not check its writes: stdout
// remembers the first that failed, and finish reports it.
func (c *invocation) emit(v any, human func(w io.Writer)) error {
	if c.g.json {
		return c.writeJSON(v)
	}
	human(c.stdout)
	return c.stdout.err
}

func (c *invocation) writeJSON(v any) error {
	c.emitted = true
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// outputWriter is stdout as the commands see it. Human output is written
// by many Fprintf calls whose errors nobody checks; this writer remembers
// the first failure, so that finish turns it into exit 1 whatever wrote
// it, and refuses the writes after it, so that no half table follows a
// lost line.
type outputWriter struct {
	w   io.Writer
	err error // the first write that failed, as an *outputError
}

func (o *outputWriter) Write(p []byte) (int, error) {
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		o.err = &outputError{err: err}
	}
	return n, o.err
}

// outputError is a write to stdout that failed: a full disk, a closed
// file. The result is written last, once the command has done what it
// does, so the message says that only the output is lost: an acquired
// lock is held all the same.
type outputError struct{ err error }

func (e *outputError) Error() string {
	return "cannot write the output: " + e.err.Error() + "; anything the command changed stands, only its output is lost"
}

func (e *outputError) Unwrap() error { return e.err }

// when shows t in local time and relative to now:
// "2026-11-29 20:03:12 CET (in 4m12s)".
func (c *invocation) when(t, now time.Time) string {
	return t.In(c.loc).Format(humanTime) + " (" + relative(t, now) + ")"
}

// relative says how far t is from now, to the second: "in 4m12s", "12s ago".
func relative(t, now time.Time) string {
	d := t.Sub(now).Round(time.Second)
	switch {
	case d > 0:
		return "in " + short(d)
	case d < 0:
		return short(-d) + " ago"
	default:
		return "now"
	}
}

// short writes a duration without trailing zero units: 5m, 1h, 4m12s.
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// plural writes a count with its noun: "1 lock", "2 locks".
func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// printable returns s as it is when every rune of it prints, else quoted,
// so that an id with a tab, a newline or a terminal escape in it cannot
// break a table or the terminal.
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

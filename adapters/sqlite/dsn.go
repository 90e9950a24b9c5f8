package sqlite

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultBusyTimeout is how long one SQLite statement waits for another
// process's write lock before the adapter's own retry takes over.
const DefaultBusyTimeout = 5 * time.Second

// settings are the connection parameters the adapter relies on. A DSN may
// override them, except _txlock: a deferred transaction that reads and then
// writes can fail at once with "database is locked", whatever the timeout.
var settings = []struct{ key, value string }{
	{"_journal_mode", "WAL"},   // readers never block the writer
	{"_synchronous", "NORMAL"}, // durable at checkpoints; WAL keeps it consistent
	{"_txlock", "immediate"},   // take the write lock at BEGIN
}

// DSN turns a database path, or a "file:" URI, into the DSN the adapter
// opens: WAL journal, synchronous=NORMAL, the busy timeout and immediate
// write transactions, unless the URI already sets them (_txlock excepted).
func DSN(pathOrURI string, busyTimeout time.Duration) (string, error) {
	if pathOrURI == "" {
		return "", fmt.Errorf("empty database path")
	}
	var base string
	var q url.Values
	if rest, ok := strings.CutPrefix(pathOrURI, "file:"); ok {
		path, query, _ := strings.Cut(rest, "?")
		var err error
		if q, err = url.ParseQuery(query); err != nil {
			return "", fmt.Errorf("parsing the query of %q: %w", redact(pathOrURI), err)
		}
		base = "file:" + path
	} else {
		q = url.Values{}
		base = "file:" + (&url.URL{Path: pathOrURI}).EscapedPath()
	}
	if busyTimeout <= 0 {
		busyTimeout = DefaultBusyTimeout
	}
	if q.Get("_busy_timeout") == "" && q.Get("_timeout") == "" {
		q.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	}
	for _, s := range settings {
		if s.key == "_txlock" || q.Get(s.key) == "" {
			q.Set(s.key, s.value)
		}
	}
	return base + "?" + q.Encode(), nil
}

// filePath returns the file a DSN names, or "" for an in-memory database.
func filePath(dsn string) string {
	rest := strings.TrimPrefix(dsn, "file:")
	path, query, _ := strings.Cut(rest, "?")
	if q, _ := url.ParseQuery(query); q.Get("mode") == "memory" || path == ":memory:" || path == "" {
		return ""
	}
	if p, err := url.PathUnescape(path); err == nil {
		return p
	}
	return path
}

// createPrivate creates the database file with mode 0600 if it does not
// exist yet, so that SQLite (which would use 0644) never makes a lock store
// that other users can read. SQLite gives its -wal and -shm files the same
// mode as the database.
func createPrivate(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if os.IsExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}

// redact hides a password in a DSN-like string, for messages.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			return u.Redacted()
		}
	}
	return s
}

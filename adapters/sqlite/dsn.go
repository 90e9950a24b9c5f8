package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cleveragents/locks/domain"
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
//
// Errors: a *domain.ValidationError (Field "database") for an empty path, a
// URI whose query does not parse, an in-memory database (see InMemory), or
// a parameter that would break what the store promises (see checkParams:
// a _pragma of a setting the store makes itself, a journal that is OFF or
// in MEMORY, nolock=1, a unix-* VFS), naming the parameter.
func DSN(pathOrURI string, busyTimeout time.Duration) (string, error) {
	if pathOrURI == "" {
		return "", &domain.ValidationError{Field: "database", Reason: "must name a SQLite file"}
	}
	var base string
	var q url.Values
	if rest, ok := strings.CutPrefix(pathOrURI, "file:"); ok {
		path, query, _ := strings.Cut(rest, "?")
		var err error
		if q, err = url.ParseQuery(query); err != nil {
			return "", &domain.ValidationError{Field: "database",
				Reason: fmt.Sprintf("the query of %q does not parse: %v", redact(pathOrURI), err)}
		}
		base = "file:" + path
	} else {
		q = url.Values{}
		// A path that begins with two slashes or more names the same file
		// as with one (on the systems SQLite's unix VFS runs on), but in a
		// URI "file://tmp/x.db" makes tmp an authority, which SQLite
		// refuses after creating "/x.db".
		if strings.HasPrefix(pathOrURI, "//") {
			pathOrURI = "/" + strings.TrimLeft(pathOrURI, "/")
		}
		base = "file:" + (&url.URL{Path: pathOrURI}).EscapedPath()
	}
	for _, m := range q["mode"] {
		if !slices.Contains([]string{"ro", "rw", "rwc", "memory"}, m) {
			// SQLite refuses it too, but only after the adapter has
			// created the file.
			return "", &domain.ValidationError{Field: "database", Reason: fmt.Sprintf(
				"mode=%s in %q is none of SQLite's access modes, ro, rw, rwc and memory (in lower case)", m, redact(pathOrURI))}
		}
	}
	if err := checkParams(q, pathOrURI); err != nil {
		return "", err
	}
	if inMemory(base, q) {
		return "", &domain.ValidationError{Field: "database", Reason: fmt.Sprintf(
			"%q names an in-memory SQLite database, which each connection of the store would see as "+
				"a separate, empty database: to keep the locks in this process's memory, set the database "+
				"to locks.MemoryDatabase (%q); to share them, name a file", redact(pathOrURI), ":memory:")}
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

// pragmaAdvice says why DSN refuses a "_pragma" of each name, and what to
// write instead. The module sets these itself; the driver runs a _pragma
// first, so it either fights the module's setting (a journal switch while
// other connections hold the file: busy, after creating it) or is undone.
var pragmaAdvice = map[string]string{
	"journal_mode": "the module sets the journal (WAL) on every connection: ask for a rollback journal with " +
		"_journal_mode=DELETE, TRUNCATE or PERSIST instead",
	"synchronous":        "the module sets synchronous on every connection: write _synchronous=FULL (or NORMAL) instead",
	"busy_timeout":       "the module's file lock waits as long as SQLite's busy timeout: write _busy_timeout=MILLISECONDS instead (or set Options.BusyTimeout)",
	"locking_mode":       "the lock store is shared by every process on the file, which locking_mode=EXCLUSIVE would keep out: drop it",
	"wal_autocheckpoint": "the module runs the checkpoints itself, away from the writes: drop it",
	"journal_size_limit": "the module runs the checkpoints and bounds the WAL itself: drop it",
	"user_version":       "it would change the file on every connection, even one the module then refuses: drop it",
	"application_id":     "it would change the file on every connection, even one the module then refuses: drop it",
	"schema_version":     "it would change the file on every connection, even one the module then refuses: drop it",
	"writable_schema":    "it lets a statement corrupt the schema the module relies on: drop it",
}

// checkParams refuses the parameters of a file: URI (its query q) that
// would break a journal that survives a crash, SQLite's file locks between
// processes, or a refused file left as it was. uri is for the messages.
func checkParams(q url.Values, uri string) error {
	refuse := func(param, why string) error {
		return &domain.ValidationError{Field: "database", Reason: fmt.Sprintf("%s in %q is refused: %s", param, redact(uri), why)}
	}
	for _, p := range q["_pragma"] {
		if strings.Contains(p, ";") {
			return refuse("_pragma="+p, "give one pragma per _pragma parameter, without \";\"")
		}
		// A bare name ("_pragma=journal_mode") only reads the setting.
		if name, arg := pragmaParts(p); arg != "" && pragmaAdvice[name] != "" {
			return refuse("_pragma="+p, pragmaAdvice[name])
		}
	}
	for _, key := range []string{"_journal_mode", "_journal"} {
		for _, v := range q[key] {
			if strings.EqualFold(v, "OFF") || strings.EqualFold(v, "MEMORY") {
				return refuse(key+"="+v, "without a journal on disk, a crash during a commit can corrupt the database: "+
					"use WAL (the default), DELETE, TRUNCATE or PERSIST")
			}
		}
	}
	for _, v := range q["nolock"] {
		if v != "" && v != "0" {
			return refuse("nolock="+v, "SQLite would take no file locks, and two processes could hold the same lock: drop it")
		}
	}
	for _, v := range q["vfs"] {
		if strings.HasPrefix(v, "unix-") {
			return refuse("vfs="+v, "this VFS locks the file differently from the module's other processes (or not at all), "+
				"so two processes could hold the same lock: drop it")
		}
	}
	return nil
}

// pragmaParts splits a _pragma parameter, "name(arg)" or "name=arg" as
// the driver runs it after "pragma ", into its name, lower case and
// without a schema ("main.journal_mode"), and its argument, lower case and
// trimmed ("" when it only reads the setting).
func pragmaParts(p string) (name, arg string) {
	p = strings.ToLower(strings.TrimSpace(p))
	i := strings.IndexAny(p, "(=")
	if i < 0 {
		i = len(p)
	}
	name = strings.TrimSpace(p[:i])
	if j := strings.LastIndexByte(name, '.'); j >= 0 {
		name = name[j+1:]
	}
	return name, strings.Trim(p[i:], " (=)")
}

// falsy reports whether v is one of the driver's false booleans.
func falsy(v string) bool {
	return slices.Contains([]string{"0", "no", "false", "off"}, strings.ToLower(v))
}

// InMemory reports whether pathOrURI names an in-memory SQLite database
// (":memory:", a file: URI with mode=memory, the memdb VFS, or an empty
// name), which DSN refuses: it lives and dies with one process, and each
// connection of the store would get one of its own.
func InMemory(pathOrURI string) bool {
	if pathOrURI == ":memory:" {
		return true
	}
	rest, ok := strings.CutPrefix(pathOrURI, "file:")
	if !ok {
		return false
	}
	path, query, _ := strings.Cut(rest, "?")
	q, err := url.ParseQuery(query)
	return err == nil && inMemory("file:"+path, q)
}

// inMemory is InMemory for base (a "file:" URI without its query) and q;
// an empty name is a temporary database private to each connection.
func inMemory(base string, q url.Values) bool {
	// A parameter may be given more than once: refusing any occurrence of
	// these values is the strict reading.
	for _, mode := range q["mode"] {
		if mode == "memory" {
			return true
		}
	}
	for _, vfs := range q["vfs"] {
		if vfs == "memdb" {
			return true
		}
	}
	name := uriPath(base)
	return name == ":memory:" || name == ""
}

// uriPath returns the file name that SQLite reads in base, a "file:" URI
// without its query: percent-decoded, after an authority ("file://" with
// "localhost" or nothing) is dropped, and up to a fragment.
func uriPath(base string) string {
	path := strings.TrimPrefix(base, "file:")
	if rest, ok := strings.CutPrefix(path, "//"); ok {
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			path = rest[i:]
		} else {
			path = ""
		}
	}
	path, _, _ = strings.Cut(path, "#")
	if p, err := url.PathUnescape(path); err == nil {
		return p
	}
	return path
}

// readOnlyMode reports whether a DSN made by DSN asks SQLite to open the
// database read-only (mode=ro; immutable=1, which also promises that
// nobody writes the file; query_only): the store could not write through
// it, and SQLite would still leave files behind (-wal and -shm, or an
// empty database where there was none).
func readOnlyMode(dsn string) bool {
	return readOnlyParam(dsn) != ""
}

// readOnlyParam returns the parameter of a DSN made by DSN that makes it
// read-only (mode=ro, immutable, a query_only pragma or _query_only), or "".
func readOnlyParam(dsn string) string {
	_, query, _ := strings.Cut(dsn, "?")
	q, _ := url.ParseQuery(query)
	switch {
	case slices.Contains(q["mode"], "ro"):
		return "mode=ro"
	case slices.ContainsFunc(q["immutable"], func(v string) bool { return v != "" && v != "0" }):
		return "immutable=" + q.Get("immutable")
	}
	for _, v := range q["_query_only"] {
		if !falsy(v) {
			return "_query_only=" + v
		}
	}
	for _, p := range q["_pragma"] {
		if name, arg := pragmaParts(p); name == "query_only" && arg != "" && !falsy(arg) {
			return "_pragma=" + p
		}
	}
	return ""
}

// readOnlyModeError refuses dsn, read-only (readOnlyParam), for the
// operation op.
func readOnlyModeError(op, dsn string) error {
	p := readOnlyParam(dsn)
	return &domain.StoreError{Op: op, Kind: domain.StoreReadOnly, Err: fmt.Errorf("the file: URI asks for %s", p),
		Advice: "drop " + p + " from the URI: the lock store writes to acquire, renew, release and clean up locks (OpenReadOnly reads without writing)"}
}

// filePath returns the file a DSN made by DSN names, or "" for an in-memory
// database (which DSN refuses).
func filePath(dsn string) string {
	base, query, _ := strings.Cut(dsn, "?")
	if q, _ := url.ParseQuery(query); inMemory(base, q) {
		return ""
	}
	return uriPath(base)
}

// createPrivate creates the database file with mode 0600 if it does not
// exist yet, so that SQLite (which would use 0644) never makes a lock store
// that other users can read. SQLite gives its -wal and -shm files the same
// mode as the database. It creates the file without keeping a descriptor
// where it can (createFile): another goroutine of this process may open
// the new file through SQLite at once, and closing a descriptor would drop
// that connection's locks.
func createPrivate(path string) error {
	if path == "" {
		return nil
	}
	if err := createFile(path, 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
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

// busyTimeout returns how long the connections of a DSN made by DSN wait
// for another process's write lock: the file lock that queues the
// processes' writers waits as long.
func busyTimeout(dsn string) time.Duration {
	_, query, _ := strings.Cut(dsn, "?")
	q, _ := url.ParseQuery(query)
	for _, key := range []string{"_busy_timeout", "_timeout"} {
		if ms, err := strconv.Atoi(q.Get(key)); err == nil && ms > 0 {
			return time.Duration(ms) * time.Millisecond
		}
	}
	return DefaultBusyTimeout
}

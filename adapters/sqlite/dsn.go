package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cleveragents/locks/domain"
)

// DefaultBusyTimeout is how long a statement waits for another process's write lock.
const DefaultBusyTimeout = 5 * time.Second

// settings may be overridden by a DSN, except _txlock: a deferred read-then-
// write can fail at once with "database is locked".
var settings = []struct{ key, value string }{
	{"_journal_mode", "WAL"},   // readers never block the writer
	{"_synchronous", "NORMAL"}, // durable at checkpoints; WAL keeps it consistent
	{"_txlock", "immediate"},   // take the write lock at BEGIN
}

// DSN turns a database path, or a "file:" URI, into the DSN the adapter
// opens, with the busy timeout and the settings the URI does not set.
// Errors: a *domain.ValidationError (Field "database") for an empty path, a
// bad query, an in-memory database (InMemory) or a refused parameter.
func DSN(pathOrURI string, busyTimeout time.Duration) (string, error) {
	if pathOrURI == "" {
		return "", invalidDatabase("must name a SQLite file")
	}
	base, q := "", url.Values{}
	if strings.HasPrefix(pathOrURI, "file:") {
		var err error
		if base, q, err = splitDSN(pathOrURI); err != nil {
			return "", invalidDatabase(fmt.Sprintf("the query of %q does not parse: %v", redact(pathOrURI), err))
		}
	} else {
		// In "file://tmp/x.db", tmp is an authority, refused after creating /x.db.
		if strings.HasPrefix(pathOrURI, "//") {
			pathOrURI = "/" + strings.TrimLeft(pathOrURI, "/")
		}
		base = "file:" + (&url.URL{Path: pathOrURI}).EscapedPath()
	}
	if err := checkParams(q, pathOrURI); err != nil {
		return "", err
	}
	if inMemory(base, q) {
		return "", invalidDatabase(fmt.Sprintf(
			"%q names an in-memory SQLite database, which each connection of the store would see as "+
				"a separate, empty database: to keep the locks in this process's memory, set the database "+
				"to locks.MemoryDatabase (%q); to share them, name a file", redact(pathOrURI), ":memory:"))
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

func invalidDatabase(reason string) error {
	return &domain.ValidationError{Field: "database", Reason: reason}
}

func splitDSN(dsn string) (base string, q url.Values, err error) {
	base, query, _ := strings.Cut(dsn, "?")
	q, err = url.ParseQuery(query)
	return base, q, err
}

const changesFile = "it would change the file on every connection, even one the module then refuses: drop it"

// pragmaAdvice says why DSN refuses a "_pragma" of each name. The driver runs
// a _pragma first, so it fights the module's own setting or is undone.
var pragmaAdvice = map[string]string{
	"journal_mode": "the module sets the journal (WAL) on every connection: ask for a rollback journal with " +
		"_journal_mode=DELETE, TRUNCATE or PERSIST instead",
	"synchronous":        "the module sets synchronous on every connection: write _synchronous=FULL (or NORMAL) instead",
	"busy_timeout":       "the module's file lock waits as long as SQLite's busy timeout: write _busy_timeout=MILLISECONDS instead (or set Options.BusyTimeout)",
	"locking_mode":       "the lock store is shared by every process on the file, which locking_mode=EXCLUSIVE would keep out: drop it",
	"wal_autocheckpoint": "the module runs the checkpoints itself, away from the writes: drop it",
	"journal_size_limit": "the module runs the checkpoints and bounds the WAL itself: drop it",
	"user_version":       changesFile,
	"application_id":     changesFile,
	"schema_version":     changesFile,
	"writable_schema":    "it lets a statement corrupt the schema the module relies on: drop it",
}

// checkParams refuses the parameters in q that would break the store's promises.
func checkParams(q url.Values, uri string) error {
	for _, m := range q["mode"] {
		if !slices.Contains([]string{"ro", "rw", "rwc", "memory"}, m) { // SQLite refuses it after creating the file
			return invalidDatabase(fmt.Sprintf(
				"mode=%s in %q is none of SQLite's access modes, ro, rw, rwc and memory (in lower case)", m, redact(uri)))
		}
	}
	refuse := func(param, why string) error {
		return invalidDatabase(fmt.Sprintf("%s in %q is refused: %s", param, redact(uri), why))
	}
	for _, p := range q["_pragma"] {
		if strings.Contains(p, ";") {
			return refuse("_pragma="+p, "give one pragma per _pragma parameter, without \";\"")
		}
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

// pragmaParts splits "name(arg)" or "name=arg" into the lower-case name
// without a schema ("main.") and argument ("" when it only reads).
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

func falsy(v string) bool {
	return slices.Contains([]string{"0", "no", "false", "off"}, strings.ToLower(v))
}

// InMemory reports whether pathOrURI names an in-memory database, which DSN
// refuses: each connection of the store would get its own.
func InMemory(pathOrURI string) bool {
	if pathOrURI == ":memory:" {
		return true
	}
	base, q, err := splitDSN(pathOrURI)
	return strings.HasPrefix(pathOrURI, "file:") && err == nil && inMemory(base, q)
}

// inMemory is InMemory for a split URI (an empty name is private to a connection).
func inMemory(base string, q url.Values) bool {
	name := uriPath(base)
	return slices.Contains(q["mode"], "memory") || slices.Contains(q["vfs"], "memdb") || name == ":memory:" || name == ""
}

// uriPath returns the file SQLite reads in base: after the authority, before a fragment, unescaped.
func uriPath(base string) string {
	path := strings.TrimPrefix(base, "file:")
	if rest, ok := strings.CutPrefix(path, "//"); ok {
		path = ""
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			path = rest[i:]
		}
	}
	path, _, _ = strings.Cut(path, "#")
	if p, err := url.PathUnescape(path); err == nil {
		return p
	}
	return path
}

// readOnlyMode: the store could not write, yet SQLite would leave files behind.
func readOnlyMode(dsn string) bool { return readOnlyParam(dsn) != "" }

// readOnlyParam returns the parameter that makes dsn read-only, or "".
func readOnlyParam(dsn string) string {
	_, q, _ := splitDSN(dsn)
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

func readOnlyModeError(op, dsn string) error {
	p := readOnlyParam(dsn)
	return &domain.StoreError{Op: op, Kind: domain.StoreReadOnly, Err: fmt.Errorf("the file: URI asks for %s", p),
		Advice: "drop " + p + " from the URI: the lock store writes to acquire, renew, release and clean up locks (OpenReadOnly reads without writing)"}
}

// filePath returns the file that dsn, made by DSN (never in memory), names.
func filePath(dsn string) string {
	base, _, _ := strings.Cut(dsn, "?")
	return kernelPath(uriPath(base))
}

// kernelPath names path's file as the kernel resolves it, and SQLite with
// it: filepath.Abs cleans "dir/link/.." to "dir" before it follows link,
// where the kernel goes to the parent of link's target. Paths without
// ".." are left as they are.
func kernelPath(path string) string {
	i := strings.LastIndexByte(path, '/')
	if i < 0 || !strings.Contains(path[:i], "..") {
		return path
	}
	dir, base := path[:i], path[i+1:]
	if dir == "" || base == "" || base == "." || base == ".." {
		return path
	}
	real, err := filepath.EvalSymlinks(dir) // follows each link before the ".." after it
	if err != nil {
		return path // a missing directory: Open says so
	}
	return filepath.Join(real, base)
}

// createPrivate creates a missing database 0600, not SQLite's 0644, which -wal and -shm copy.
func createPrivate(path string) error {
	if err := createFile(path, 0o600); !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// createOpen creates the file and closes it at once, which drops the locks of
// a goroutine that opened the new file meanwhile (not on Windows).
func createOpen(path string, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
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

// busyTimeout is dsn's; the writers' file lock waits as long.
func busyTimeout(dsn string) time.Duration {
	_, q, _ := splitDSN(dsn)
	for _, key := range []string{"_busy_timeout", "_timeout"} {
		if ms, err := strconv.Atoi(q.Get(key)); err == nil && ms > 0 {
			return time.Duration(ms) * time.Millisecond
		}
	}
	return DefaultBusyTimeout
}

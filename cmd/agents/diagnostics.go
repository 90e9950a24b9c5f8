package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/proc"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// errChecksFailed ends a diagnostics run in which a check failed; the
// report is the output, so nothing more is printed on stdout.
var errChecksFailed = errors.New("a check failed")

// The statuses of a check.
const (
	statusOK   = "ok"
	statusWarn = "warn"
	statusFail = "fail"
)

// check is one line of the diagnostics report.
type check struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	// Count is what stale_locks and active_locks counted, when they could.
	Count *int `json:"count,omitempty"`
	// Oldest is the longest-held active lock (active_locks).
	Oldest *lockDoc `json:"oldest,omitempty"`
}

// report is the JSON output of diagnostics.
type report struct {
	OK     bool    `json:"ok"`
	Checks []check `json:"checks"`
}

// diagnostics runs "diagnostics": the checks database, schema, stale_locks,
// active_locks and orphaned_locks. It never changes the database, not even by opening it:
// it does not build the container (which would create the file, migrate it
// and run the startup cleanup, hiding the stale locks it exists to show),
// and opens the file read-only through sqlite.OpenReadOnly, or a PostgreSQL
// server through postgres.OpenReadOnly, whose connections cannot write.
// Exit 1 when a check fails; warnings leave it 0.
func (c *invocation) diagnostics(ctx context.Context, args []string) error {
	if _, err := positional(args); err != nil {
		return err
	}
	path, isDefault, err := c.database()
	if err != nil {
		return err
	}
	checks := c.runChecks(ctx, path, isDefault)
	r := report{OK: true, Checks: checks}
	for i := range checks {
		checks[i].Detail = c.redact(oneLine(checks[i].Detail))
		if checks[i].Status == statusFail {
			r.OK = false
		}
	}
	if err := c.emit(r, func(w io.Writer) { c.printReport(w, c.redact(path), r) }); err != nil {
		return err
	}
	if !r.OK {
		return errChecksFailed
	}
	return nil
}

// inspection is a lock database opened for diagnostics, read-only, whatever
// its kind.
type inspection struct {
	repo   application.LockRepository
	schema func(context.Context) (schemaState, error)
	close  func() error
	// clock, when set, is the clock the checks decide on (the server's
	// time on PostgreSQL); clockCheck reports it.
	clock      application.Clock
	clockCheck *check
}

// schemaState is what the schema check found.
type schemaState struct {
	migrationApplied bool
	locksTable       bool
	// server: the database is a PostgreSQL server, and schema the current
	// schema, where the migrations create the locks table ("" when the
	// search_path names none).
	server bool
	schema string
	// searchPath and user are the session's search_path and user, for a
	// refusal that says why schema is "".
	searchPath, user string
	// otherTables are the tables of a SQLite file that belong to neither
	// the lock store nor SQLite.
	otherTables []string
}

func (c *invocation) runChecks(ctx context.Context, path string, isDefault bool) (checks []check) {
	inspect := c.inspectSQLite
	if locks.IsPostgres(path) {
		inspect = c.inspectPostgres
	}
	database, db := inspect(ctx, path)
	if db == nil {
		return notChecked(database)
	}
	defer db.close()
	clk := c.clock
	if db.clock != nil {
		clk = db.clock
	}
	svc, err := application.NewLockService(db.repo, clk, 0)
	if err != nil {
		return notChecked(check{Name: "database", Status: statusFail, Detail: err.Error()})
	}
	if db.clockCheck != nil {
		defer func() { checks = append(checks, *db.clockCheck) }()
	}
	schema, st := c.checkSchema(ctx, db)
	if !st.locksTable {
		const skipped = "not checked: no locks table to read (see the schema check)"
		return []check{database, schema,
			{Name: "stale_locks", Status: statusFail, Detail: skipped},
			{Name: "active_locks", Status: statusFail, Detail: skipped},
			{Name: "orphaned_locks", Status: statusFail, Detail: skipped}}
	}
	return []check{database, schema, c.checkStale(ctx, svc, path, isDefault), c.checkActive(ctx, svc), c.checkOrphaned(ctx, svc)}
}

// checkOrphaned counts the active locks whose holder is a process of this
// machine that is gone: the next acquire of each takes it over at once.
// It only reads.
func (c *invocation) checkOrphaned(ctx context.Context, svc *application.LockService) check {
	m, err := proc.ThisMachine()
	if err != nil {
		return check{Name: "orphaned_locks", Status: statusOK, Detail: "not checked: this system shows no processes to check (" + err.Error() + ")"}
	}
	ls, err := svc.List(ctx, application.ListOptions{})
	if err != nil {
		return check{Name: "orphaned_locks", Status: statusFail, Detail: "not counted: " + err.Error()}
	}
	var orphaned []domain.Lock
	for _, l := range ls {
		if p, ok := domain.ParseProcessOwner(l.Owner); ok && m.Gone(p) {
			orphaned = append(orphaned, l)
		}
	}
	n := len(orphaned)
	if n == 0 {
		return check{Name: "orphaned_locks", Status: statusOK, Detail: "no lock is held by a process of this machine that is gone", Count: &n}
	}
	first := newLockDoc(orphaned[0])
	return check{Name: "orphaned_locks", Status: statusWarn, Count: &n, Oldest: &first, Detail: fmt.Sprintf(
		"%s held by processes of this machine that are gone, such as %s held by %q%s; the next acquire of each takes it over at once",
		plural(n, "lock"), printable(orphaned[0].Resource.String()), orphaned[0].Owner, noteOf(orphaned[0]))}
}

// inspectSQLite opens the SQLite file for diagnostics, read-only, and
// checks whether this user could write it: the database check, and the
// open database unless it failed to open.
func (c *invocation) inspectSQLite(ctx context.Context, path string) (check, *inspection) {
	writable := sqlite.CheckWritable(path)
	db, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
	if err != nil {
		return check{Name: "database", Status: statusFail, Detail: c.openAdvice(path, err)}, nil
	}
	database := check{Name: "database", Status: statusOK, Detail: path + " opens, and this user can write it"}
	if writable != nil {
		database = check{Name: "database", Status: statusFail, Detail: writable.Error()}
	}
	return database, sqliteInspection(db)
}

// notChecked completes a failed database check with the checks that
// could not run, so that every report names all five.
func notChecked(database check) []check {
	const skipped = "not checked: the database could not be opened"
	return []check{
		database,
		{Name: "schema", Status: statusFail, Detail: skipped},
		{Name: "stale_locks", Status: statusFail, Detail: skipped},
		{Name: "active_locks", Status: statusFail, Detail: skipped},
		{Name: "orphaned_locks", Status: statusFail, Detail: skipped},
	}
}

// openAdvice says why the database did not open and what to do.
func (c *invocation) openAdvice(path string, err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		_, isDefault, _ := c.database()
		if isDefault {
			return fmt.Sprintf("there is no lock database yet at the default path %s: to create it, run '%s', "+
				"or start the application (diagnostics never creates one; the first 'agents locks acquire' or 'agents locks run' does)",
				path, c.setupCommand(true))
		}
		if dir := filepath.Dir(sqliteFile(path)); !isDefault && !isDir(dir) {
			return fmt.Sprintf("there is no database at %s, nor a directory %s: check --db (or AGENTS_DB); to create a lock database there, "+
				"create the directory, then run '%s', or start the application (diagnostics never creates one)", path, dir, c.setupCommand(true))
		}
		return fmt.Sprintf("there is no database at %s: check --db (or AGENTS_DB); to create a lock database there, run '%s', "+
			"or start the application (diagnostics never creates one)", path, c.setupCommand(true))
	case domain.IsStoreKind(err, domain.StoreCorrupt):
		return fmt.Sprintf("%s is not a SQLite database, or is damaged (%v): point --db (or AGENTS_DB) at the lock database, "+
			"or move this file away and run '%s' to create a new one", path, errors.Unwrap(err), c.setupCommand(true))
	}
	return err.Error()
}

// setupCommand is a command that creates the lock database of --db (with
// create, the --create that a --db file needs) or applies its migrations,
// and leaves no lock behind: it takes one on a resource of a store that
// holds none yet, runs true, and releases it.
func (c *invocation) setupCommand(create bool) string {
	cmd := "agents"
	db, isDefault, _ := c.database()
	if !isDefault {
		cmd += " --db " + shellQuote(db)
	}
	cmd += " locks run"
	if create && !isDefault && !locks.IsPostgres(db) {
		cmd += " --create"
	}
	return cmd + " plan setup -- true"
}

// checkSchema checks that the migration is applied; it also returns what it
// found, since without a locks table there is nothing to count.
func (c *invocation) checkSchema(ctx context.Context, db *inspection) (check, schemaState) {
	st, err := db.schema(ctx)
	if err != nil {
		return check{Name: "schema", Status: statusFail, Detail: err.Error()}, st
	}
	migration := "migration " + sqlite.MigrationName
	if st.server {
		migration = "migration " + postgres.MigrationName
	}
	switch {
	case st.server && st.schema == "":
		return check{Name: "schema", Status: statusFail, Detail: migration + " is not applied: the search_path of the URL " +
			"names no schema that exists and that this user may use; create the schema or fix search_path, " +
			"then run '" + c.setupCommand(false) + "' (with the same --db or AGENTS_DB), or start the application, so that the migrations run"}, st
	case st.server && st.migrationApplied:
		return check{Name: "schema", Status: statusOK, Detail: fmt.Sprintf("%s is applied in schema %q", migration, st.schema)}, st
	case st.server && st.locksTable:
		return check{Name: "schema", Status: statusFail, Detail: fmt.Sprintf("%s is not applied in schema %q, yet a locks table exists there: "+
			"it was made by hand and may not be what the service expects; drop or rename it, or point search_path at another schema, "+
			"and let the service create it", migration, st.schema)}, st
	case st.server:
		return check{Name: "schema", Status: statusFail, Detail: fmt.Sprintf("%s is not applied in schema %q and there is no locks table there: "+
			"if this is the lock database, run '%s' (with the same --db or AGENTS_DB), or start the application, "+
			"so that the migrations run", migration, st.schema, c.setupCommand(false))}, st
	case st.migrationApplied:
		return check{Name: "schema", Status: statusOK, Detail: migration + " is applied"}, st
	case st.locksTable && len(st.otherTables) > 0:
		return check{Name: "schema", Status: statusFail, Detail: fmt.Sprintf("%s is not applied: "+
			"the file holds another application's tables (%s) and a locks table that the lock module did not create; "+
			"point --db (or AGENTS_DB) at the lock database: "+
			"the lock commands add no tables to a database that the application embedding the lock module has not set up",
			migration, strings.Join(st.otherTables, ", "))}, st
	case st.locksTable:
		return check{Name: "schema", Status: statusFail, Detail: migration +
			" is not applied, yet a locks table exists: it was made by hand and may not be what the service expects; " +
			"move the file away and let the service create a new database"}, st
	case len(st.otherTables) > 0:
		return check{Name: "schema", Status: statusFail, Detail: fmt.Sprintf("%s is not applied and there is no locks table: "+
			"the file holds another application's tables (%s); point --db (or AGENTS_DB) at the lock database: "+
			"the lock commands add no tables to a database that the application embedding the lock module has not set up",
			migration, strings.Join(st.otherTables, ", "))}, st
	}
	return check{Name: "schema", Status: statusFail, Detail: migration +
		" is not applied and there is no locks table: if this is the lock database, run '" + c.setupCommand(false) +
		"', or start the application, so that the migrations run"}, st
}

func (c *invocation) checkStale(ctx context.Context, svc *application.LockService, path string, isDefault bool) check {
	n, err := svc.StaleCount(ctx)
	if err != nil {
		return check{Name: "stale_locks", Status: statusFail, Detail: "not counted: " + err.Error()}
	}
	if n == 0 {
		return check{Name: "stale_locks", Status: statusOK, Detail: "no expired locks wait for cleanup", Count: &n}
	}
	cmd := "agents locks cleanup"
	if !isDefault {
		cmd += " --db " + shellQuote(writable(path))
	}
	have := "have expired but are"
	if n == 1 {
		have = "has expired but is"
	}
	return check{Name: "stale_locks", Status: statusWarn, Count: &n, Detail: fmt.Sprintf(
		"%s %s still stored: cleanup has not run since (the application, and 'agents locks' acquire, run, release and release-all, run it when they open the database); run '%s' to purge them",
		plural(n, "lock"), have, cmd)}
}

func (c *invocation) checkActive(ctx context.Context, svc *application.LockService) check {
	ls, err := svc.List(ctx, application.ListOptions{})
	if err != nil {
		return check{Name: "active_locks", Status: statusFail, Detail: "not counted: " + err.Error()}
	}
	n := len(ls)
	if n == 0 {
		return check{Name: "active_locks", Status: statusOK, Detail: "no locks are held", Count: &n}
	}
	oldest := ls[0]
	for _, l := range ls[1:] {
		if l.AcquiredAt.Before(oldest.AcquiredAt) {
			oldest = l
		}
	}
	doc := newLockDoc(oldest)
	now := svc.Now()
	return check{Name: "active_locks", Status: statusOK, Count: &n, Oldest: &doc, Detail: fmt.Sprintf(
		"%s held; the oldest is %s, held by %q%s since %s", plural(n, "lock"), printable(oldest.Resource.String()),
		oldest.Owner, noteOf(oldest), c.when(oldest.AcquiredAt, now))}
}

// noteOf is " (note ...)" for a lock with a note, quoted: the holder's words.
func noteOf(l domain.Lock) string {
	if l.Note == "" {
		return ""
	}
	return fmt.Sprintf(" (note %q)", l.Note)
}

func (c *invocation) printReport(w io.Writer, path string, r report) {
	fmt.Fprintf(w, "Diagnostics of %s\n", path)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	warnings, failures := 0, 0
	for _, ch := range r.Checks {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", ch.Status, ch.Name, ch.Detail)
		switch ch.Status {
		case statusWarn:
			warnings++
		case statusFail:
			failures++
		}
	}
	tw.Flush()
	switch {
	case failures > 0:
		fmt.Fprintf(w, "%s failed.\n", plural(failures, "check"))
	case warnings > 0:
		fmt.Fprintf(w, "No check failed; %s.\n", plural(warnings, "warning"))
	default:
		fmt.Fprintln(w, "All checks passed.")
	}
}

// shellQuote quotes a path for a command line that a user may paste.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=+,@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// writable returns the --db of a command that writes to the database that
// db names: db without what makes a file: URI read-only (mode=ro,
// immutable=1, a query_only pragma), which diagnostics may read through
// but cleanup refuses.
func writable(db string) string {
	rest, ok := strings.CutPrefix(db, "file:")
	if !ok {
		return db
	}
	path, query, ok := strings.Cut(rest, "?")
	if !ok {
		return db
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return db
	}
	if q.Get("mode") == "ro" {
		q.Del("mode")
	}
	q.Del("immutable")
	if p := q["_pragma"]; len(p) > 0 {
		q["_pragma"] = slices.DeleteFunc(slices.Clone(p), func(v string) bool {
			return strings.HasPrefix(strings.ToLower(strings.TrimSpace(v)), "query_only")
		})
		if len(q["_pragma"]) == 0 {
			q.Del("_pragma")
		}
	}
	if len(q) == 0 {
		return "file:" + path
	}
	return "file:" + path + "?" + q.Encode()
}

package locks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/adapters/postgres/pgdsn"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/internal/backend"
)

// The kinds of database Config.Database can name; all but memory register
// their Open (internal/backend) from their own package.
const (
	kindMemory   = "memory"
	kindSQLite   = backend.SQLite
	kindPostgres = backend.Postgres
)

// PostgresPackage is the package a program imports (import _) to let Open
// use a PostgreSQL server; without it, Open refuses a PostgreSQL DSN with
// a *domain.ValidationError that names this package.
const PostgresPackage = "github.com/cleveragents/locks/adapters/postgres"

// supportedDatabases names, for errors, every kind of database Open takes.
const supportedDatabases = `a SQLite file (a path, or a "file:" URI), ` +
	`a PostgreSQL server (a "postgres://" or "postgresql://" URL, or "host=... dbname=..."; ` +
	`needs import _ "` + PostgresPackage + `"), or "` + MemoryDatabase + `"`

// urlScheme matches a URL's scheme ("mysql://...", "mysql:db"), refused
// rather than taken for a SQLite file's name; one letter is a Windows drive.
var urlScheme = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]+):(//)?`)

// databaseKind says which kind of store database names, or why Open
// refuses what would otherwise become a SQLite file's name.
func databaseKind(database string) (string, error) {
	switch {
	case database == "":
		return "", invalidDatabase("is empty: it must name " + supportedDatabases)
	case strings.TrimFunc(database, isBlank) == "":
		return "", invalidDatabase("is blank (white space or invisible characters only): it must name " + supportedDatabases)
	case strings.ContainsRune(database, 0):
		return "", invalidDatabase("contains a NUL byte, which no file name or DSN may contain")
	case database == MemoryDatabase:
		return kindMemory, nil
	case pgdsn.IsURL(database):
		return kindPostgres, nil
	}
	if m := urlScheme.FindStringSubmatch(database); m != nil {
		if m[1] == "file" {
			return kindSQLite, nil // SQLite's URI: its name may hold anything
		}
		return "", schemeError(database, m)
	}
	pg, err := pgdsn.KeywordValue(database)
	if err != nil {
		return "", err
	}
	if pg {
		return kindPostgres, nil
	}
	if strings.TrimFunc(database, isBlank) != database {
		return "", invalidDatabase(fmt.Sprintf(
			"%q begins or ends with white space (or an invisible character), which is taken for a typo rather than part of a file's name: "+
				"remove it, or, for a file whose name has it, write a file: URI with the white space escaped (file:%s)",
			database, (&url.URL{Path: database}).EscapedPath()))
	}
	return kindSQLite, nil
}

// ValidateDatabase returns the *domain.ValidationError with which Open
// refuses database by its form alone (empty, blank, an unsupported URL, a
// malformed keyword/value DSN), or nil, opening nothing: for a command
// line to refuse a mistyped database before it acts.
func ValidateDatabase(database string) error {
	_, err := databaseKind(database)
	return err
}

// schemeError refuses database, whose scheme is m (from urlScheme).
func schemeError(database string, m []string) error {
	if err := pgdsn.SchemeError(m[1], m[2]); err != nil {
		return err
	}
	scheme := m[1] + ":" + m[2]
	if strings.ToLower(m[1]) == "file" {
		return invalidDatabase(`write "file:" in lower case: SQLite reads only that as a URI, and would take "` + scheme + `" for part of a file's name`)
	}
	reason := "the " + scheme + " scheme is not supported: name " + supportedDatabases
	if m[2] == "" {
		reason += " (for a file whose name has a colon, write a directory before it: ./" + database + ")"
	}
	return invalidDatabase(reason)
}

func invalidDatabase(reason string) error {
	return &domain.ValidationError{Field: "database", Reason: reason}
}

// IsPostgres reports whether database names a PostgreSQL server (a
// postgres:// or postgresql:// URL, or a well-formed libpq keyword/value
// string), whether or not the program imports PostgresPackage.
func IsPostgres(database string) bool {
	kind, err := databaseKind(database)
	return err == nil && kind == kindPostgres
}

// isBlank reports whether r is white space or an invisible format
// character (zero-width space, BOM), which a reader does not see.
func isBlank(r rune) bool { return unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) }

func openMemory(_ context.Context, opts backend.Options) (backend.Store, error) {
	clk := opts.Clock
	if clk == nil {
		clk = clock.New()
	}
	return memoryStore{repo: memory.NewLockRepository(), clock: clk}, nil
}

// memoryStore has no other process to wake, nor SQL transactions to fence or queue.
type memoryStore struct {
	repo  *memory.LockRepository
	clock application.Clock
}

func (m memoryStore) Repository() application.LockRepository { return m.repo }
func (m memoryStore) Clock() application.Clock               { return m.clock }
func (m memoryStore) Wakeups() application.Wakeups           { return nil }
func (m memoryStore) Close(context.Context) error            { return nil }
func (m memoryStore) Writer() func(context.Context, func(context.Context, *sql.Tx) error) error {
	return nil
}

func (m memoryStore) CheckFence(context.Context, Querier, application.Fence, time.Time, backend.ReadLock) error {
	return &domain.StoreError{Op: "fenced write", Kind: domain.StoreInternal, Err: errNoSQL}
}

var errNoSQL = errors.New("the locks are kept in this process's memory (MemoryDatabase), not in a SQL database: " +
	"there is no transaction to fence; open the container on the SQLite file or PostgreSQL database that holds the plans")

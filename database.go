package locks

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"unicode"

	"github.com/cleveragents/locks/adapters/postgres/pgdsn"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/internal/backend"
)

// The kinds of database that Config.Database can name. Those other than
// memory register their Open from their own package (internal/backend):
// SQLite's is always linked, PostgreSQL's when the program imports it.
const (
	kindMemory   = "memory"
	kindSQLite   = backend.SQLite
	kindPostgres = backend.Postgres
)

// PostgresPackage is the package a program imports to let Open use a
// PostgreSQL server:
//
//	import _ "github.com/cleveragents/locks/adapters/postgres"
//
// Without it, a program links no PostgreSQL code, and Open refuses a
// PostgreSQL DSN with a *domain.ValidationError that names this package.
const PostgresPackage = "github.com/cleveragents/locks/adapters/postgres"

// supportedDatabases names, for error messages, every kind of database
// Open accepts.
const supportedDatabases = `a SQLite file (a path, or a "file:" URI), ` +
	`a PostgreSQL server (a "postgres://" or "postgresql://" URL, or "host=... dbname=..."; ` +
	`needs import _ "` + PostgresPackage + `"), or "` + MemoryDatabase + `"`

// urlScheme matches the scheme of a URL ("mysql://...", "mysql:db"),
// which Open refuses rather than take it for the start of a SQLite file's
// name; "file:" is SQLite's own URI, and a single letter is a Windows
// drive ("C:\\locks.db"). A file whose name has a colon in it is named
// with a directory: "./notes:2024.db".
var urlScheme = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]+):(//)?`)

// databaseKind says which kind of store database names, or why Open
// cannot take it: empty or blank, a URL of a database it does not support,
// or a malformed libpq keyword/value DSN, each of which would otherwise
// become the name of a SQLite file.
func databaseKind(database string) (string, error) {
	switch {
	case database == "":
		return "", &domain.ValidationError{Field: "database", Reason: "is empty: it must name " + supportedDatabases}
	case strings.TrimFunc(database, isBlank) == "":
		return "", &domain.ValidationError{Field: "database", Reason: "is blank (white space or invisible characters only): it must name " + supportedDatabases}
	case strings.ContainsRune(database, 0):
		return "", &domain.ValidationError{Field: "database", Reason: "contains a NUL byte, which no file name or DSN may contain"}
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
		return "", &domain.ValidationError{Field: "database", Reason: fmt.Sprintf(
			"%q begins or ends with white space (or an invisible character), which is taken for a typo rather than part of a file's name: "+
				"remove it, or, for a file whose name has it, write a file: URI with the white space escaped (file:%s)",
			database, (&url.URL{Path: database}).EscapedPath())}
	}
	return kindSQLite, nil
}

// ValidateDatabase returns the *domain.ValidationError with which Open
// refuses database by its form alone (empty, blank, a URL of a database it
// does not support, a malformed PostgreSQL keyword/value DSN), or nil. It
// opens, creates and connects to nothing, and says nothing of whether the
// program can open a PostgreSQL DSN (see PostgresPackage). A command line
// calls it to refuse a mistyped database before it acts.
func ValidateDatabase(database string) error {
	_, err := databaseKind(database)
	return err
}

// schemeError refuses database, a URL whose scheme (m, from urlScheme) is
// not one Open supports.
func schemeError(database string, m []string) error {
	if err := pgdsn.SchemeError(m[1], m[2]); err != nil {
		return err
	}
	scheme := m[1] + ":" + m[2]
	if strings.ToLower(m[1]) == "file" {
		return &domain.ValidationError{Field: "database",
			Reason: `write "file:" in lower case: SQLite reads only that as a URI, and would take "` + scheme + `" for part of a file's name`}
	}
	reason := "the " + scheme + " scheme is not supported: name " + supportedDatabases
	if m[2] == "" {
		reason += " (for a file whose name has a colon, write a directory before it: ./" + database + ")"
	}
	return &domain.ValidationError{Field: "database", Reason: reason}
}

// notLinked is Open's error for a PostgreSQL DSN in a program that does
// not import PostgresPackage.
func notLinked() error {
	return &domain.ValidationError{Field: "database",
		Reason: "names a PostgreSQL server, which this program cannot open: import " + PostgresPackage + " to enable PostgreSQL"}
}

// IsPostgres reports whether database names a PostgreSQL server rather
// than a SQLite file: a postgres:// or postgresql:// URL, or a well-formed
// libpq keyword/value string ("host=db user=app dbname=agents") with one of
// libpq's keywords. Use it to route a DSN before Open, as the agents CLI
// does; it says nothing of whether the program can open it (see
// PostgresPackage). A malformed keyword/value string is neither a server
// nor a file: ValidateDatabase and Open refuse it.
func IsPostgres(database string) bool {
	kind, err := databaseKind(database)
	return err == nil && kind == kindPostgres
}

// isBlank reports whether r is white space (Unicode's, as NBSP and the
// ideographic space) or an invisible format character (a zero-width
// space, a byte-order mark, a soft hyphen): a name made of them, or that
// begins or ends with one, looks blank, or like the name without them,
// to the person who typed or pasted it.
func isBlank(r rune) bool { return unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) }

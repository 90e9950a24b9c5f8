package locks

import (
	"regexp"
	"strings"

	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/internal/backend"
)

// The kinds of database that Config.Database can name. Those other than
// memory and SQLite are registered by their own package (internal/backend).
const (
	kindMemory   = "memory"
	kindSQLite   = "sqlite"
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

// urlScheme matches the scheme of a URL ("mysql://..."), which is never
// the start of a SQLite path that Open would accept; "file:" is SQLite's
// own URI, and a single letter is a Windows drive.
var urlScheme = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]+)://`)

// databaseKind says which kind of store database names, or why Open
// cannot take it: empty, or a URL of a database it does not support,
// which would otherwise become the name of a SQLite file.
func databaseKind(database string) (string, error) {
	switch {
	case database == "":
		return "", &domain.ValidationError{Field: "database", Reason: "is empty: it must name " + supportedDatabases}
	case database == MemoryDatabase:
		return kindMemory, nil
	case IsPostgres(database):
		return kindPostgres, nil
	}
	if m := urlScheme.FindStringSubmatch(database); m != nil && m[1] != "file" {
		return "", &domain.ValidationError{Field: "database",
			Reason: "the " + m[1] + ":// scheme is not supported: name " + supportedDatabases}
	}
	return kindSQLite, nil
}

// notLinked is Open's error for a PostgreSQL DSN in a program that does
// not import PostgresPackage.
func notLinked() error {
	return &domain.ValidationError{Field: "database",
		Reason: "names a PostgreSQL server, which this program cannot open: import " + PostgresPackage + " to enable PostgreSQL"}
}

// IsPostgres reports whether database names a PostgreSQL server rather
// than a SQLite file: a postgres:// or postgresql:// URL, or libpq's
// key=value form ("host=db user=app dbname=agents") beginning with one of
// its keywords, so that such a DSN never becomes the name of a file. Use
// it to route a DSN before Open, as the agents CLI does; it says nothing
// of whether the program can open it (see PostgresPackage).
func IsPostgres(database string) bool {
	if strings.HasPrefix(database, "postgres://") || strings.HasPrefix(database, "postgresql://") {
		return true
	}
	fields := strings.Fields(database)
	if len(fields) == 0 {
		return false
	}
	key, _, ok := strings.Cut(fields[0], "=")
	return ok && libpqKeywords[key]
}

var libpqKeywords = map[string]bool{
	"host": true, "hostaddr": true, "port": true, "dbname": true, "user": true, "password": true,
	"sslmode": true, "connect_timeout": true, "application_name": true, "service": true,
}

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

// urlScheme matches the scheme of a URL ("mysql://...", "mysql:db"),
// which Open refuses rather than take it for the start of a SQLite file's
// name; "file:" is SQLite's own URI, and a single letter is a Windows
// drive ("C:\\locks.db"). A file whose name has a colon in it is named
// with a directory: "./notes:2024.db".
var urlScheme = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]+):(//)?`)

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
	m := urlScheme.FindStringSubmatch(database)
	if m == nil || m[1] == "file" {
		return kindSQLite, nil
	}
	scheme := m[1] + ":" + m[2]
	switch lower := strings.ToLower(m[1]); {
	case (lower == "postgres" || lower == "postgresql") && m[2] != "":
		return "", &domain.ValidationError{Field: "database",
			Reason: "write the scheme in lower case, " + lower + "://, as PostgreSQL's clients read it"}
	case lower == "postgres" || lower == "postgresql":
		return "", &domain.ValidationError{Field: "database",
			Reason: "the " + scheme + " scheme is not supported: a PostgreSQL URL begins with " + lower + "://"}
	case lower == "file":
		return "", &domain.ValidationError{Field: "database",
			Reason: `write "file:" in lower case: SQLite reads only that as a URI, and would take "` + scheme + `" for part of a file's name`}
	}
	reason := "the " + scheme + " scheme is not supported: name " + supportedDatabases
	if m[2] == "" {
		reason += " (for a file whose name has a colon, write a directory before it: ./" + database + ")"
	}
	return "", &domain.ValidationError{Field: "database", Reason: reason}
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
	keys, ok := keywordValues(database)
	if !ok {
		return false
	}
	for _, k := range keys {
		if libpqKeywords[k] {
			return true
		}
	}
	return false
}

// keywordValues parses database as libpq's keyword/value form, as pgx does
// (keyword = value, spaces allowed around "=", a value quoted with '...'
// and backslash escapes, or running to the next space), and returns its
// keywords; ok is false when the whole of database is not in that form.
func keywordValues(database string) (keys []string, ok bool) {
	s := strings.TrimSpace(database)
	for s != "" {
		i := strings.IndexFunc(s, func(r rune) bool { return r == '=' || r == ' ' || r == '\t' || r == '\n' || r == '\r' })
		if i <= 0 {
			return nil, false
		}
		key := s[:i]
		s = strings.TrimLeft(s[i:], " \t\n\r")
		if !strings.HasPrefix(s, "=") {
			return nil, false
		}
		s = strings.TrimLeft(s[1:], " \t\n\r")
		if strings.HasPrefix(s, "'") {
			end := 1
			for end < len(s) && s[end] != '\'' {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(s) {
				return nil, false // an unterminated quote
			}
			s = s[end+1:]
		} else {
			// Unquoted: to the next space that no backslash escapes.
			end := 0
			for end < len(s) && !strings.ContainsRune(" \t\n\r", rune(s[end])) {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			s = s[min(end, len(s)):]
		}
		keys = append(keys, key)
		s = strings.TrimLeft(s, " \t\n\r")
	}
	return keys, len(keys) > 0
}

// libpqKeywords are libpq's connection keywords (and search_path, which
// pgx passes on to the server): a keyword/value string with one of them is
// a PostgreSQL DSN.
var libpqKeywords = map[string]bool{
	"host": true, "hostaddr": true, "port": true, "dbname": true, "user": true, "password": true,
	"passfile": true, "require_auth": true, "channel_binding": true, "connect_timeout": true,
	"client_encoding": true, "options": true, "application_name": true, "fallback_application_name": true,
	"keepalives": true, "keepalives_idle": true, "keepalives_interval": true, "keepalives_count": true,
	"tcp_user_timeout": true, "replication": true, "gssencmode": true, "sslmode": true, "requiressl": true,
	"sslnegotiation": true, "sslcompression": true, "sslcert": true, "sslkey": true, "sslcertmode": true,
	"sslpassword": true, "sslrootcert": true, "sslcrl": true, "sslcrldir": true, "sslsni": true,
	"requirepeer": true, "ssl_min_protocol_version": true, "ssl_max_protocol_version": true,
	"krbsrvname": true, "gsslib": true, "gssdelegation": true, "service": true,
	"target_session_attrs": true, "load_balance_hosts": true, "search_path": true,
}

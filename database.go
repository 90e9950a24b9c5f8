package locks

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode"

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
	case strings.HasPrefix(database, "postgres://") || strings.HasPrefix(database, "postgresql://"):
		return kindPostgres, nil
	}
	if m := urlScheme.FindStringSubmatch(database); m != nil {
		if m[1] == "file" {
			return kindSQLite, nil // SQLite's URI: its name may hold anything
		}
		return "", schemeError(database, m)
	}
	if word := strings.Trim(database, libpqSpace); libpqKeywords[strings.ToLower(word)] {
		// libpq refuses it ("missing "=" after "host""): a DSN that lost
		// its value, not the name of a file beside the program.
		return "", &domain.ValidationError{Field: "database", Reason: fmt.Sprintf(
			`%q is a PostgreSQL connection keyword alone: it lacks "=value" (%s=...) to be a keyword/value DSN; `+
				"for a SQLite file of that name, write ./%s", word, strings.ToLower(word), word)}
	}
	if keywordShaped(database) {
		if err := checkKeywordValue(database); err != nil {
			return "", err
		}
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
	scheme := m[1] + ":" + m[2]
	switch lower := strings.ToLower(m[1]); {
	case (lower == "postgres" || lower == "postgresql") && m[2] != "":
		return &domain.ValidationError{Field: "database",
			Reason: "write the scheme in lower case, " + lower + "://, as PostgreSQL's clients read it"}
	case lower == "postgres" || lower == "postgresql":
		return &domain.ValidationError{Field: "database",
			Reason: "the " + scheme + " scheme is not supported: a PostgreSQL URL begins with " + lower + "://"}
	case lower == "file":
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

// libpqSpace is the white space that libpq (and pgx) skip between the
// pairs of a keyword/value string.
const libpqSpace = " \t\n\v\f\r"

// keywordShaped reports whether database reads as libpq's keyword/value
// form, rightly or not: it begins (after white space) with a word that
// starts with a letter or "_" and runs to a "=" without a "/" (so that
// "dir/a=b.db" stays a path), or it has one of libpq's keywords, in any
// case, followed by "=" at its start or after white space. Such a string is
// never the name of a file: a malformed one (a keyword without its value,
// a stray word, an unterminated quote, a keyword in upper case) would
// otherwise become a SQLite file on each host, and two hosts would each
// hold the "same" lock. So is a string of several words whose first is
// one of libpq's keywords ("host 127.0.0.1"). A file whose name looks so is named through a
// directory ("./a=b.db") or a file: URI.
func keywordShaped(database string) bool {
	s := strings.TrimLeft(database, libpqSpace)
	if s != "" && (s[0] == '_' || 'a' <= s[0]|0x20 && s[0]|0x20 <= 'z') {
		if before, _, ok := strings.Cut(s, "="); ok && !strings.Contains(before, "/") {
			return true
		}
	}
	if keywordAnywhere.MatchString(database) {
		return true
	}
	// "host 127.0.0.1": a keyword without its "=", before more words.
	words := strings.FieldsFunc(database, isLibpqSpace)
	return len(words) > 1 && libpqKeywords[strings.ToLower(words[0])]
}

// keywordAnywhere matches one of libpq's keywords, in any case, followed
// by "=", at the start of a string or after white space.
var keywordAnywhere = regexp.MustCompile(`(?i)(^|[ \t\n\v\f\r])(` + strings.Join(slices.Sorted(maps.Keys(libpqKeywords)), "|") + `)[ \t\n\v\f\r]*=`)

// checkKeywordValue parses database in libpq's keyword/value grammar, as
// pgx does (keyword = value, white space allowed around "=", a value
// quoted with '...' in which a backslash escapes the next character, or
// running to the next white space, where too a backslash escapes), and
// returns a *domain.ValidationError that says what is malformed: a word
// without "=" and value, a quote that never closes, a keyword of libpq's
// in another case than lower (libpq's keywords are case-sensitive; pgx
// would send it to the server as a setting), or no libpq keyword at all.
// The error names keywords, never values, which may be passwords.
func checkKeywordValue(database string) error {
	malformed := func(what string) error {
		return &domain.ValidationError{Field: "database", Reason: "reads as a PostgreSQL keyword/value DSN " +
			"(keyword=value pairs, separated by white space), but " + what +
			"; PostgreSQL's clients refuse it, and it is not taken for the name of a SQLite file"}
	}
	var keys []string
	s := strings.TrimLeft(database, libpqSpace)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return malformed(fmt.Sprintf(`%q has no "=" and value`, strings.FieldsFunc(s, isLibpqSpace)[0]))
		}
		key := strings.Trim(s[:eq], libpqSpace)
		if i := strings.IndexAny(key, libpqSpace); i >= 0 {
			return malformed(fmt.Sprintf(`%q has no "=" and value`, key[:i]))
		}
		if key == "" {
			return malformed(`a "=" has no keyword before it`)
		}
		s = strings.TrimLeft(s[eq+1:], libpqSpace)
		quoted := strings.HasPrefix(s, "'")
		if quoted {
			s = s[1:]
		}
		end := 0
		for ; end < len(s); end++ {
			if quoted && s[end] == '\'' || !quoted && isLibpqSpace(rune(s[end])) {
				break
			}
			if s[end] == '\\' {
				end++ // the escaped character, whatever it is
			}
		}
		switch {
		case quoted && end >= len(s):
			return malformed(fmt.Sprintf("the value of %s opens a quote (') that never closes", key))
		case quoted:
			end++ // the closing quote
		}
		s = strings.TrimLeft(s[min(end, len(s)):], libpqSpace)
		keys = append(keys, key)
	}
	named := false
	for _, k := range keys {
		if lower := strings.ToLower(k); lower != k && libpqKeywords[lower] {
			return malformed(fmt.Sprintf("%q is not a libpq keyword: they are lower case (%s)", k, lower))
		}
		named = named || libpqKeywords[k]
	}
	if !named {
		name := "./" + database
		if slices.ContainsFunc(keys, looksSecret) {
			name = "./NAME" // the string may hold a secret: not quoted
		}
		return malformed("it names none of libpq's connection keywords (host, dbname, user, ...): " +
			"for a PostgreSQL server, give host= and dbname=; for a SQLite file of that name, write " + name)
	}
	return nil
}

// looksSecret reports whether a keyword's value may be a secret, which an
// error must not quote.
func looksSecret(key string) bool {
	k := strings.ToLower(key)
	return strings.Contains(k, "pass") || strings.Contains(k, "token") || strings.Contains(k, "key") ||
		strings.Contains(k, "secret") || strings.Contains(k, "auth")
}

// isBlank reports whether r is white space (Unicode's, as NBSP and the
// ideographic space) or an invisible format character (a zero-width
// space, a byte-order mark, a soft hyphen): a name made of them, or that
// begins or ends with one, looks blank, or like the name without them,
// to the person who typed or pasted it.
func isBlank(r rune) bool { return unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) }

// isLibpqSpace reports whether r is white space in libpq's keyword/value
// form.
func isLibpqSpace(r rune) bool { return strings.ContainsRune(libpqSpace, r) }

// libpqKeywords are libpq's connection keywords (and search_path, which
// pgx passes on to the server, and servicefile, which only pgx reads): a
// well-formed keyword/value string with one of them is a PostgreSQL DSN.
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
	// libpq 18's, and pgx's own servicefile.
	"min_protocol_version": true, "max_protocol_version": true, "sslkeylogfile": true, "scram_client_key": true,
	"scram_server_key": true, "oauth_issuer": true, "oauth_client_id": true, "oauth_client_secret": true,
	"oauth_scope": true, "servicefile": true,
}

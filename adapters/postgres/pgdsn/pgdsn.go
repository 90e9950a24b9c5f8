// Package pgdsn recognises a PostgreSQL DSN by its form alone (a URL, or
// libpq's keyword/value string as pgx parses it) without linking pgx, so
// that a program without adapters/postgres refuses one rather than create
// a SQLite file of that name.
package pgdsn

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/cleveragents/locks/domain"
)

// IsURL reports whether dsn is a PostgreSQL URL, in lower case as clients read it.
func IsURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// SchemeError refuses a URL whose scheme is PostgreSQL's written wrongly
// (in another case, or without "//" in slashes); nil for any other scheme.
func SchemeError(scheme, slashes string) error {
	lower := strings.ToLower(scheme)
	switch {
	case lower != "postgres" && lower != "postgresql":
		return nil
	case slashes != "":
		return &domain.ValidationError{Field: "database",
			Reason: "write the scheme in lower case, " + lower + "://, as PostgreSQL's clients read it"}
	}
	return &domain.ValidationError{Field: "database",
		Reason: "the " + scheme + ":" + slashes + " scheme is not supported: a PostgreSQL URL begins with " + lower + "://"}
}

// KeywordValue reports whether dsn is in libpq's keyword/value form, and a
// *domain.ValidationError when PostgreSQL's clients would refuse it. Such a
// string never names a file: each host would hold the "same" lock in its own.
func KeywordValue(dsn string) (bool, error) {
	if word := strings.Trim(dsn, space); keywords[strings.ToLower(word)] {
		return true, &domain.ValidationError{Field: "database", Reason: fmt.Sprintf(
			`%q is a PostgreSQL connection keyword alone: it lacks "=value" (%s=...) to be a keyword/value DSN; `+
				"for a SQLite file of that name, write ./%s", word, strings.ToLower(word), word)}
	}
	if !keywordShaped(dsn) {
		return false, nil
	}
	return true, checkKeywordValue(dsn)
}

// space is the white space libpq and pgx skip between pairs.
const space = " \t\n\v\f\r"

// keywordShaped reports whether dsn reads as keyword/value, rightly or not
// ("dir/a=b.db" stays a path; such a file is named "./a=b.db").
func keywordShaped(dsn string) bool {
	s := strings.TrimLeft(dsn, space)
	if s != "" && (s[0] == '_' || 'a' <= s[0]|0x20 && s[0]|0x20 <= 'z') {
		if before, _, ok := strings.Cut(s, "="); ok && !strings.Contains(before, "/") {
			return true
		}
	}
	if keywordAnywhere.MatchString(dsn) {
		return true
	}
	words := strings.FieldsFunc(dsn, isSpace)
	return len(words) > 1 && keywords[strings.ToLower(words[0])]
}

// keywordAnywhere matches a keyword, in any case, and "=", after white space.
var keywordAnywhere = regexp.MustCompile(`(?i)(^|[ \t\n\v\f\r])(` + strings.Join(slices.Sorted(maps.Keys(keywords)), "|") + `)[ \t\n\v\f\r]*=`)

// checkKeywordValue parses dsn as pgx does. An upper-case keyword is
// refused: pgx would send it to the server as a setting. Errors name
// keywords, never values (passwords).
func checkKeywordValue(dsn string) error {
	malformed := func(what string) error {
		return &domain.ValidationError{Field: "database", Reason: "reads as a PostgreSQL keyword/value DSN " +
			"(keyword=value pairs, separated by white space), but " + what +
			"; PostgreSQL's clients refuse it, and it is not taken for the name of a SQLite file"}
	}
	var keys []string
	s := strings.TrimLeft(dsn, space)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return malformed(fmt.Sprintf(`%q has no "=" and value`, strings.FieldsFunc(s, isSpace)[0]))
		}
		key := strings.Trim(s[:eq], space)
		if i := strings.IndexAny(key, space); i >= 0 {
			return malformed(fmt.Sprintf(`%q has no "=" and value`, key[:i]))
		}
		if key == "" {
			return malformed(`a "=" has no keyword before it`)
		}
		s = strings.TrimLeft(s[eq+1:], space)
		quoted := strings.HasPrefix(s, "'")
		if quoted {
			s = s[1:]
		}
		end := 0
		for ; end < len(s); end++ {
			if quoted && s[end] == '\'' || !quoted && isSpace(rune(s[end])) {
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
		s = strings.TrimLeft(s[min(end, len(s)):], space)
		keys = append(keys, key)
	}
	named := false
	for _, k := range keys {
		if lower := strings.ToLower(k); lower != k && keywords[lower] {
			return malformed(fmt.Sprintf("%q is not a libpq keyword: they are lower case (%s)", k, lower))
		}
		named = named || keywords[k]
	}
	if !named {
		name := "./" + dsn
		if slices.ContainsFunc(keys, looksSecret) {
			name = "./NAME" // the string may hold a secret: not quoted
		}
		return malformed("it names none of libpq's connection keywords (host, dbname, user, ...): " +
			"for a PostgreSQL server, give host= and dbname=; for a SQLite file of that name, write " + name)
	}
	return nil
}

// looksSecret reports whether a keyword's value may be a secret.
func looksSecret(key string) bool {
	k := strings.ToLower(key)
	return strings.Contains(k, "pass") || strings.Contains(k, "token") || strings.Contains(k, "key") ||
		strings.Contains(k, "secret") || strings.Contains(k, "auth")
}

func isSpace(r rune) bool { return strings.ContainsRune(space, r) }

// keywords are libpq's connection keywords, with search_path (passed to
// the server) and pgx's own servicefile.
var keywords = map[string]bool{
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
	"min_protocol_version": true, "max_protocol_version": true, "sslkeylogfile": true, "scram_client_key": true,
	"scram_server_key": true, "oauth_issuer": true, "oauth_client_id": true, "oauth_client_secret": true,
	"oauth_scope": true, "servicefile": true,
}

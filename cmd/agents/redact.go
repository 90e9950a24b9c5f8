package main

import (
	"cmp"
	"net/url"
	"slices"
	"strings"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/postgres"
)

// redacted replaces a secret of the database DSN in messages.
const redacted = "xxxxx"

// dbArg is the database as the user gave it, --db or AGENTS_DB, or "" for
// the default one; unlike database, it is never an error.
func (c *invocation) dbArg() string {
	if c.g.dbSet {
		return c.g.db
	}
	return c.env("AGENTS_DB")
}

// redact hides the secrets of the database DSN in s, a message that may
// quote the DSN (errors of the store, diagnostics' details). Lock output
// never contains the DSN and is written as it is.
func (c *invocation) redact(s string) string {
	db := c.dbArg()
	for _, secret := range secrets(db) {
		s = strings.ReplaceAll(s, secret, redacted)
	}
	if locks.IsPostgres(db) {
		s = postgres.Redact(s) // a password=... that a message quotes
	}
	return s
}

// secrets returns what must never be printed of a DSN: the password of its
// user info and the values of the query parameters whose names say they
// are secret (password, _auth_pass, token, key, ...), each as written in
// the DSN, decoded, and escaped as net/url escapes it, longest first.
func secrets(dsn string) []string {
	var values []string
	if u, err := url.Parse(dsn); err == nil {
		if u.User != nil {
			if p, ok := u.User.Password(); ok {
				values = append(values, p)
			}
		}
		for key, vs := range u.Query() {
			if isSecretKey(key) {
				values = append(values, vs...)
			}
		}
	}
	// As written: net/url decodes what it parses, and re-escapes it its own
	// way ("%2F", where the DSN may say "%2f"), and it fails on some URLs
	// that libpq and pgx accept. They read the user info up to an '@' that
	// comes before the first '/'; an '@' inside it must be escaped (see
	// checkPostgresURL), so the last '@' ends it.
	if _, rest, ok := strings.Cut(dsn, "://"); ok {
		authority, _, _ := strings.Cut(rest, "/")
		if i := strings.LastIndexByte(authority, '@'); i >= 0 {
			if _, p, ok := strings.Cut(authority[:i], ":"); ok {
				values = append(values, p)
			}
		}
	}
	if _, query, ok := strings.Cut(dsn, "?"); ok {
		query, _, _ = strings.Cut(query, "#")
		for _, kv := range strings.Split(query, "&") {
			key, value, _ := strings.Cut(kv, "=")
			if isSecretKey(key) {
				values = append(values, value)
			}
		}
	}
	var out []string
	add := func(v string) {
		if v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	for _, v := range values {
		forms := []string{v}
		if d, err := url.PathUnescape(v); err == nil {
			forms = append(forms, d)
		}
		if d, err := url.QueryUnescape(v); err == nil {
			forms = append(forms, d)
		}
		for _, f := range forms {
			add(f)
			add(url.QueryEscape(f))
			add(url.PathEscape(f))
		}
	}
	// A secret that contains another is replaced first, whole.
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return out
}

func isSecretKey(key string) bool {
	key = strings.ToLower(key)
	for _, word := range []string{"pass", "pwd", "secret", "token", "key"} {
		if strings.Contains(key, word) {
			return true
		}
	}
	return false
}

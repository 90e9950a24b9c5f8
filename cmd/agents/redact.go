package main

import (
	"net/url"
	"strings"
)

// redacted replaces a secret of the database DSN in messages.
const redacted = "xxxxx"

// redact hides the secrets of the database DSN in s, a message that may
// quote the DSN (errors of the store, diagnostics' details). Lock output
// never contains the DSN and is written as it is.
func (c *invocation) redact(s string) string {
	db := c.g.db
	if !c.g.dbSet {
		db = c.env("AGENTS_DB")
	}
	for _, secret := range secrets(db) {
		s = strings.ReplaceAll(s, secret, redacted)
	}
	return s
}

// secrets returns what must never be printed of a DSN: the password of its
// user info and the values of the query parameters whose names say they
// are secret (password, _auth_pass, token, key, ...), each as written and
// as escaped in a URL.
func secrets(dsn string) []string {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil
	}
	var values []string
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
	var out []string
	for _, v := range values {
		if v != "" {
			out = append(out, v, url.QueryEscape(v), url.PathEscape(v))
		}
	}
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

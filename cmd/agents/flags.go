package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
)

// globals are the flags of agents itself, --db and --json, which act on
// every command, before or after its name, and --owner, which only the
// commands that act for an owner (or filter by one) take.
type globals struct {
	db       string
	dbSet    bool
	owner    string
	ownerSet bool
	json     bool
	deadline time.Duration
}

func (g *globals) register(fs *pflag.FlagSet) {
	fs.Func("db", "the lock database: a file `PATH`, a file: URI or a postgres:// URL (env AGENTS_DB; default $XDG_DATA_HOME/cleveragents/agents.db)",
		func(s string) error { g.db, g.dbSet = s, true; return nil })
	fs.BoolFunc("json", "print exactly one JSON document on stdout",
		func(s string) (err error) { g.json, err = strconv.ParseBool(s); return err })
	g.registerDeadline(fs)
}

func (g *globals) registerOwner(fs *pflag.FlagSet, usage string) {
	fs.Func("owner", usage, func(s string) error { g.owner, g.ownerSet = s, true; return nil })
}

// positional checks that args, the arguments left once the flags are
// parsed, are exactly those that names lists.
func positional(args []string, names ...string) ([]string, error) {
	switch {
	case len(args) == len(names):
		return args, nil
	case len(names) == 0:
		return nil, usagef("expected no arguments, got %q", strings.Join(args, " "))
	default:
		return nil, usagef("expected %s, got %s", strings.Join(names, " and "), plural(len(args), "argument"))
	}
}

// wantsJSON reports whether args ask for JSON output, for the one case in
// which parsing did not get as far as --json: a flag error before it.
func wantsJSON(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "json" {
			ok, err := strconv.ParseBool(value)
			return !hasValue || (err == nil && ok)
		}
	}
	return false
}

// database returns the lock database to use, and whether it is the default
// one, whose directory the lock commands create. A PostgreSQL URL is never
// the default: nothing is created on the file system for it.
func (c *invocation) database() (db string, isDefault bool, err error) {
	switch {
	case c.g.dbSet:
		db = c.g.db
	case c.env("AGENTS_DB") != "":
		db = c.env("AGENTS_DB")
	default:
		dir, err := c.dataDir()
		if err != nil {
			return "", false, err
		}
		return filepath.Join(dir, "cleveragents", defaultFile), true, nil
	}
	switch {
	case db == "":
		return "", false, usagef("--db must not be empty")
	case sqlite.InMemory(db):
		return "", false, usagef("--db %s names an in-memory SQLite database, which lives and dies with one process "+
			"and cannot be shared between processes: it would give every run an empty store of its own; "+
			"name a file (or leave --db out for the default database), or a postgres:// URL to share the locks between hosts", db)
	}
	if locks.IsPostgres(db) {
		if err := checkPostgresURL(db); err != nil {
			return "", false, err
		}
		return db, false, nil
	}
	if scheme, ok := urlScheme(db); ok && (scheme == "postgres" || scheme == "postgresql") {
		_, rest, _ := strings.Cut(db, "://")
		return "", false, usagef("--db: write the URL's scheme in lower case, as PostgreSQL's clients read it: %s://%s",
			scheme, rest)
	} else if ok && scheme != "file" {
		return "", false, usagef("--db: a URL of scheme %q names no database that agents can use; "+
			"pass a SQLite file path, a file: URI (file:/path/agents.db?_busy_timeout=5000) or a postgres:// (or postgresql://) URL", scheme)
	}
	// A malformed PostgreSQL keyword/value DSN, or white space alone,
	// names no file: the module refuses it before anything is created.
	if err := locks.ValidateDatabase(db); err != nil {
		return "", false, err
	}
	if isDir(sqliteFile(db)) {
		return "", false, &noStoreError{msg: fmt.Sprintf("%s is a directory, not a lock database: "+
			"check --db (or AGENTS_DB) and name the database file in it (the default is %s)", db, defaultFile)}
	}
	return db, false, nil
}

// defaultFile is the name of the default database in its directory.
const defaultFile = "agents.db"

// urlScheme returns the scheme of db when it is a URL (scheme://...),
// lower-cased.
func urlScheme(db string) (string, bool) {
	scheme, _, ok := strings.Cut(db, "://")
	if !ok || scheme == "" {
		return "", false
	}
	for i, r := range scheme {
		letter := 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
		if !letter && (i == 0 || !strings.ContainsRune("0123456789+.-", r)) {
			return "", false
		}
	}
	return strings.ToLower(scheme), true
}

// dataDir is the user's XDG data directory. A relative XDG_DATA_HOME is
// ignored, as the XDG specification requires.
func (c *invocation) dataDir() (string, error) {
	if dir := c.env("XDG_DATA_HOME"); filepath.IsAbs(dir) {
		return dir, nil
	}
	if home := c.env("HOME"); home != "" {
		return filepath.Join(home, ".local", "share"), nil
	}
	return "", usagef("no default database: neither XDG_DATA_HOME nor HOME is set; pass --db PATH or set AGENTS_DB")
}

// owner returns the owner the command acts for: --owner, else AGENTS_OWNER.
func (c *invocation) owner() (string, error) {
	owner := c.g.owner
	if !c.g.ownerSet {
		owner = c.env("AGENTS_OWNER")
		if owner == "" {
			return "", usagef("missing owner: pass --owner ID or set AGENTS_OWNER " +
				"(the owner holds the lock, and only the same owner can renew or release it)")
		}
	}
	return owner, domain.ValidateOwner(owner)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/sqlite"
)

// What a command may do to the lock database. Only the commands that take
// a lock create a database or apply migrations: a mistyped --db on any
// other command must not leave an empty database behind that reports "no
// locks" while the real one still holds them, nor add tables to some
// other application's file.

// storeAccess is what a command that builds the container may do.
type storeAccess int

const (
	// mayCreate: acquire and run create the database, or migrate an empty
	// one, but leave another application's SQLite file alone.
	mayCreate storeAccess = iota
	// existingOnly: release, renew, release-all and cleanup write to a
	// lock database that exists already, and to nothing else.
	existingOnly
)

// errNoStore matches a refusal to act on a database that is not a lock
// database: a missing file, a file of another application, a schema
// without the locks table.
var errNoStore = errors.New("not a lock database")

type noStoreError struct{ msg string }

func (e *noStoreError) Error() string { return e.msg }

// Is makes errors.Is(err, errNoStore) true.
func (e *noStoreError) Is(target error) bool { return target == errNoStore }

// noDefaultStore says that the default database, db, does not exist yet,
// to a user who named none (who has no --db to check).
func noDefaultStore(db string) string {
	return fmt.Sprintf("there is no lock database yet at the default path %s: "+
		"the first 'agents locks acquire' or 'agents locks run' creates it there (--db or AGENTS_DB name another)", db)
}

// onlyCreators ends the advice of a refusal.
const onlyCreators = "only 'agents locks acquire' and 'agents locks run' create a lock database, " +
	"and only at the default path or with --create"

// registerCreate adds --create to the commands that may create a database.
func (c *invocation) registerCreate(fs *pflag.FlagSet) {
	fs.BoolVar(&c.create, "create", false, "create the lock database that --db names if there is none yet (env AGENTS_CREATE=1); "+
		"without it, only the default database is created")
}

// createAsked reports whether --create or AGENTS_CREATE asks acquire and
// run to create a database that --db (or AGENTS_DB) names: a mistyped
// path must not become a second lock database in which a second party
// "holds" a lock that the first holds in the real one.
func (c *invocation) createAsked() (bool, error) {
	if c.create {
		return true, nil
	}
	v := c.env("AGENTS_CREATE")
	if v == "" {
		return false, nil
	}
	create, err := strconv.ParseBool(v)
	if err != nil {
		return false, usagef("AGENTS_CREATE=%q: set it to 1 to create a missing lock database, or to 0 (or unset it) not to", v)
	}
	return create, nil
}

// checkMissing refuses a SQLite database that does not exist yet, unless
// it is the default one or its creation was asked for.
func (c *invocation) checkMissing(db string, isDefault bool) error {
	create, err := c.createAsked()
	if err != nil || isDefault || create {
		return err
	}
	file := sqliteFile(db)
	if _, err := os.Stat(file); !errors.Is(err, fs.ErrNotExist) {
		return nil // there, or unreadable: locks.Open says which
	}
	if target, err := os.Readlink(file); err == nil {
		return &noStoreError{msg: fmt.Sprintf("%s is a symbolic link to %s, which does not exist: check the link, "+
			"or the path (--db or AGENTS_DB)", db, target)}
	}
	dir := filepath.Dir(file)
	if !isDir(dir) {
		return &noStoreError{msg: fmt.Sprintf("there is no lock database at %s, nor a directory %s: check the path (--db or AGENTS_DB); "+
			"to create a new lock database there, create the directory, then pass --create (or set AGENTS_CREATE=1)", db, dir)}
	}
	if !canCreateIn(dir) {
		return &noStoreError{msg: fmt.Sprintf("there is no lock database at %s, and this user may not create one in %s: "+
			"check the path (--db or AGENTS_DB), or create the database as a user who may write there", db, dir)}
	}
	return &noStoreError{msg: fmt.Sprintf("there is no lock database at %s: check the path (--db or AGENTS_DB), "+
		"or pass --create (or set AGENTS_CREATE=1) to create a new lock database there", db)}
}

// sqliteFile is the file that a SQLite path or file: URI names.
func sqliteFile(db string) string {
	if !strings.HasPrefix(db, "file:") {
		return db
	}
	u, err := url.Parse(db)
	if err != nil {
		return db
	}
	if u.Opaque != "" {
		return u.Opaque
	}
	return u.Path
}

// isDir reports whether path is a directory.
func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// checkStore refuses, before the container is built, a database that the
// command must not create or migrate. It opens the database read-only, as
// diagnostics does, so the check itself changes nothing.
func (c *invocation) checkStore(ctx context.Context, db string, isDefault bool, access storeAccess) error {
	if access == mayCreate {
		if locks.IsPostgres(db) {
			return nil // a schema is shared by design: the migrations add the locks table beside the others
		}
		if err := c.checkMissing(db, isDefault); err != nil {
			return err
		}
		ro, err := c.openReadOnly(ctx, db)
		if err != nil {
			// No file yet, or one that locks.Open reports with the advice
			// it gives applications: nothing to protect here.
			return nil
		}
		defer ro.close()
		st, err := ro.schema(ctx)
		if err != nil {
			return err
		}
		if !st.migrationApplied && (len(st.otherTables) > 0 || st.locksTable) {
			// Another application's file, even one with a locks table of
			// its own and nothing else: locks.Open would refuse the
			// latter too, but this message names what the file holds.
			var tables string
			switch {
			case len(st.otherTables) == 0:
				tables = "a locks table that the lock module did not create"
			case st.locksTable:
				tables = "tables " + strings.Join(st.otherTables, ", ") + ", and a locks table that the lock module did not create"
			default:
				tables = "tables " + strings.Join(st.otherTables, ", ")
			}
			return &noStoreError{msg: fmt.Sprintf("%s is a database of another application (%s): "+
				"check --db (or AGENTS_DB); the lock commands add no tables to a database that the application embedding the lock module has not set up",
				db, tables)}
		}
		return nil
	}
	ro, err := c.openReadOnly(ctx, db)
	if err != nil {
		return err
	}
	defer ro.close()
	return c.requireSchema(ctx, ro, db)
}

// openReadOnly opens the lock database for reading only, creating
// nothing and never waiting for a writer: sqlite.OpenReadOnly, or
// postgres.OpenReadOnly, whose connections cannot write.
func (c *invocation) openReadOnly(ctx context.Context, db string) (*inspection, error) {
	if locks.IsPostgres(db) {
		pg, err := postgres.OpenReadOnly(ctx, db, postgres.Options{})
		if err != nil {
			return nil, err
		}
		return postgresInspection(pg), nil
	}
	sq, err := sqlite.OpenReadOnly(ctx, db, sqlite.Options{})
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, isDefault, _ := c.database(); isDefault {
			return nil, &noStoreError{msg: noDefaultStore(db)}
		}
		return nil, &noStoreError{msg: fmt.Sprintf("there is no lock database at %s: check --db (or AGENTS_DB); %s", db, onlyCreators)}
	case err != nil:
		return nil, err
	}
	return sqliteInspection(sq), nil
}

// sqliteInspection is a read-only SQLite database, as the checks read it.
func sqliteInspection(db *sqlite.DB) *inspection {
	return &inspection{repo: sqlite.NewLockRepository(db), close: db.Close,
		schema: func(ctx context.Context) (schemaState, error) {
			st, err := db.Schema(ctx)
			return schemaState{migrationApplied: st.MigrationApplied, locksTable: st.LocksTable, otherTables: st.OtherTables}, err
		}}
}

// postgresInspection is a read-only PostgreSQL database, as the checks
// read it.
func postgresInspection(db *postgres.DB) *inspection {
	return &inspection{repo: postgres.NewLockRepository(db), close: db.Close,
		schema: func(ctx context.Context) (schemaState, error) {
			st, err := db.Schema(ctx)
			return schemaState{migrationApplied: st.MigrationApplied, locksTable: st.LocksTable, schema: st.Schema, server: true}, err
		}}
}

// requireSchema refuses a database in which the lock store's migration has
// not created the locks table: nothing of the lock store is there to read
// or change.
func (c *invocation) requireSchema(ctx context.Context, ro *inspection, db string) error {
	st, err := ro.schema(ctx)
	if err != nil {
		return err
	}
	if st.locksTable && st.migrationApplied {
		return nil
	}
	where := db
	if st.server {
		where = fmt.Sprintf("%s (schema %q)", db, st.schema)
	}
	what := "no locks table"
	if st.locksTable {
		what = "a locks table that the lock store's migration did not create"
	}
	return &noStoreError{msg: fmt.Sprintf("%s is not a lock database: it has %s; check --db (or AGENTS_DB, or the search_path of a URL) "+
		"names the lock database, and run 'agents diagnostics' with the same --db to see what it holds; %s", where, what, onlyCreators)}
}

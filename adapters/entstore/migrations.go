package entstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	entlock "github.com/cleveragents/locks/ent/lock"
)

// VersionTable records the module's applied migrations in goose's format.
// goose's default table belongs to an embedding application that may also
// use goose: shared, each side's versions would look missing to the other.
const VersionTable = "locks_schema_version"

// LegacyVersionTable is goose's default table, where earlier versions of
// the module recorded their migrations. The module only reads it.
const LegacyVersionTable = goose.DefaultTablename

// MigrationName returns the NAME part of a migration file's path
// ("VERSION_NAME.sql", as Ent writes them for goose).
func MigrationName(file string) string {
	_, name, _ := strings.Cut(strings.TrimSuffix(path.Base(file), ".sql"), "_")
	return name
}

// MigrationVersion returns the goose version (the VERSION part) of the
// migration named name among the .sql files at the root of fsys.
func MigrationVersion(fsys fs.FS, name string) (int64, error) {
	files, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return 0, err
	}
	for _, f := range files {
		if MigrationName(f) == name {
			return fileVersion(f)
		}
	}
	return 0, fmt.Errorf("no embedded migration is named %s", name)
}

// MigrationVersions returns the goose versions of the .sql files at the
// root of fsys, in ascending order.
func MigrationVersions(fsys fs.FS) ([]int64, error) {
	files, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	versions := make([]int64, 0, len(files))
	for _, f := range files {
		v, err := fileVersion(f)
		if err != nil {
			return nil, err
		}
		versions = append(versions, v)
	}
	slices.Sort(versions)
	return versions, nil
}

func fileVersion(file string) (int64, error) {
	version, _, _ := strings.Cut(path.Base(file), "_")
	return strconv.ParseInt(version, 10, 64)
}

// VersionTables is how an adapter names the version tables to
// AdoptHistory.
type VersionTables struct {
	// Dialect is goose's name of the database.
	Dialect database.Dialect
	// Ours and Legacy are VersionTable and LegacyVersionTable as written
	// in SQL, qualified (and quoted) where the database needs it.
	Ours, Legacy string
	// Exists reports whether the table named name (unqualified) exists
	// where the migrations create their tables.
	Exists func(ctx context.Context, db database.DBTxConn, name string) (bool, error)
}

// AdoptHistory copies to a new VersionTable the history of a database
// that an earlier version of the module migrated: when VersionTable does
// not exist, LegacyVersionTable records the first migration of fsys as
// applied, and the locks table exists, it creates VersionTable with
// version 0 and every migration of fsys that LegacyVersionTable records as
// applied, and reports true. LegacyVersionTable is left as it is: it may
// hold an application's rows. It runs in tx, which the caller commits,
// while keeping other processes from doing the same.
func AdoptHistory(ctx context.Context, tx *sql.Tx, t VersionTables, fsys fs.FS) (bool, error) {
	for _, c := range []struct {
		table string
		want  bool
	}{{VersionTable, false}, {LegacyVersionTable, true}, {entlock.Table, true}} {
		ok, err := t.Exists(ctx, tx, c.table)
		if err != nil || ok != c.want {
			return false, err
		}
	}
	versions, err := MigrationVersions(fsys)
	if err != nil || len(versions) == 0 {
		return false, err
	}
	legacy, err := database.NewStore(t.Dialect, t.Legacy)
	if err != nil {
		return false, err
	}
	var applied []int64
	for _, v := range versions {
		m, err := legacy.GetMigration(ctx, tx, v)
		if errors.Is(err, database.ErrVersionNotFound) {
			continue
		}
		if err != nil {
			return false, err
		}
		if m.IsApplied {
			applied = append(applied, v)
		}
	}
	if len(applied) == 0 || applied[0] != versions[0] {
		return false, nil // the locks table is not ours to vouch for
	}
	ours, err := database.NewStore(t.Dialect, t.Ours)
	if err != nil {
		return false, err
	}
	if err := ours.CreateVersionTable(ctx, tx); err != nil {
		return false, err
	}
	for _, v := range append([]int64{0}, applied...) {
		if err := ours.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return false, err
		}
	}
	return true, nil
}

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

// MigrationVersion returns the VERSION of the migration name in fsys.
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

// MigrationVersions returns the versions of fsys's migrations, ascending.
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

// VersionTables names the version tables for AdoptHistory.
type VersionTables struct {
	Dialect database.Dialect // goose's name of the database
	// Ours and Legacy are VersionTable and LegacyVersionTable, qualified and quoted for SQL.
	Ours, Legacy string
	// Exists reports whether the table name (unqualified) exists where
	// the migrations create their tables.
	Exists func(ctx context.Context, db database.DBTxConn, name string) (bool, error)
}

// AdoptHistory reports whether it created VersionTable from the history
// of an earlier version of the module: if VersionTable is missing, the
// locks table exists, and LegacyVersionTable records fsys's first
// migration, it records version 0 and fsys's migrations that
// LegacyVersionTable records, which it leaves as is (an application's
// rows). It runs in tx, which the caller commits, keeping others out.
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
		switch m, err := legacy.GetMigration(ctx, tx, v); {
		case errors.Is(err, database.ErrVersionNotFound):
		case err != nil:
			return false, err
		case m.IsApplied:
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

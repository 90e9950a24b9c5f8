package entstore

import (
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// The adapters' migration files are named as Ent writes them for goose:
// "VERSION_NAME.sql", e.g. "20261129190022_m4_001_concurrency_locks.sql".

// MigrationName returns the NAME part of a migration file's path.
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
			version, _, _ := strings.Cut(path.Base(f), "_")
			return strconv.ParseInt(version, 10, 64)
		}
	}
	return 0, fmt.Errorf("no embedded migration is named %s", name)
}

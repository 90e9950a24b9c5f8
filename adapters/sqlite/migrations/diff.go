//go:build ignore

// Command diff writes a new versioned migration for the SQLite store: the
// changes that bring the migrations in this directory up to the Ent schema,
// in goose's file format, with Atlas's integrity file (atlas.sum) updated.
// Run it after changing ent/schema and regenerating ent/:
//
//	go run ./adapters/sqlite/migrations/diff.go NAME
//
// It replays the existing migrations on an in-memory database, so it needs
// neither a server nor the atlas binary.
package main

import (
	"context"
	"database/sql"
	"log"
	"os"
	"strings"

	atlas "ariga.io/atlas/sql/schema"
	"ariga.io/atlas/sql/sqlite"
	"ariga.io/atlas/sql/sqltool"
	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"entgo.io/ent/dialect/sql/schema"
	_ "modernc.org/sqlite"

	"github.com/cleveragents/locks/ent/migrate"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: go run ./adapters/sqlite/migrations/diff.go NAME")
	}
	db, err := sql.Open("sqlite", "file:dev?mode=memory&_pragma=foreign_keys(1)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	dir, err := sqltool.NewGooseDir("adapters/sqlite/migrations")
	if err != nil {
		log.Fatalf("opening the migration directory (run from the module root): %v", err)
	}
	m, err := schema.NewMigrate(entsql.OpenDB(dialect.SQLite, db),
		schema.WithDir(dir),
		schema.WithMigrationMode(schema.ModeReplay),
		schema.WithDialect(dialect.SQLite),
		schema.WithFormatter(sqltool.GooseFormatter),
		schema.WithDiffHook(keepDeclaredTypes),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := m.NamedDiff(context.Background(), os.Args[1], migrate.Tables...); err != nil {
		log.Fatalf("writing the migration: %v", err)
	}
}

// keepDeclaredTypes writes the column types that the Ent schema declares for
// SQLite (varchar(255), ...) into the migration as they are. Atlas would
// otherwise print them without their width, and the width is part of the
// published schema even though SQLite does not enforce it (the service does).
func keepDeclaredTypes(next schema.Differ) schema.Differ {
	return schema.DiffFunc(func(current, desired *atlas.Schema) ([]atlas.Change, error) {
		changes, err := next.Diff(current, desired)
		if err != nil {
			return nil, err
		}
		// Only columns being created are rewritten: for existing ones SQLite
		// compares the type names alone, and so must the next diff.
		for _, ch := range changes {
			switch ch := ch.(type) {
			case *atlas.AddTable:
				for _, c := range ch.T.Columns {
					declare(ch.T.Name, c)
				}
			case *atlas.ModifyTable:
				for _, tc := range ch.Changes {
					if add, ok := tc.(*atlas.AddColumn); ok {
						declare(ch.T.Name, add.C)
					}
				}
			}
		}
		return changes, nil
	})
}

func declare(table string, c *atlas.Column) {
	if raw := declaredType(table, c.Name); raw != "" {
		c.Type.Type = &sqlite.UserDefinedType{T: raw}
	}
}

func declaredType(table, column string) string {
	for _, t := range migrate.Tables {
		if t.Name != table {
			continue
		}
		for _, c := range t.Columns {
			if c.Name == column {
				return strings.ToLower(c.SchemaType[dialect.SQLite])
			}
		}
	}
	return ""
}

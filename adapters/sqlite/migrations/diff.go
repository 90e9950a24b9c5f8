//go:build ignore

// Command diff writes the goose migration that brings the migrations in
// this directory up to the Ent schema, and updates atlas.sum. Run it after
// changing ent/schema and regenerating ent/:
//
//	go run ./adapters/sqlite/migrations/diff.go NAME
//
// It replays the migrations in memory: no server, no atlas binary.
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

// keepDeclaredTypes writes the column types the Ent schema declares for
// SQLite (varchar(255), ...) as they are: Atlas would drop the width,
// which is part of the published schema though only the service enforces it.
func keepDeclaredTypes(next schema.Differ) schema.Differ {
	return schema.DiffFunc(func(current, desired *atlas.Schema) ([]atlas.Change, error) {
		changes, err := next.Diff(current, desired)
		if err != nil {
			return nil, err
		}
		// Only new columns: for existing ones SQLite compares type names alone.
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
	for _, t := range migrate.Tables {
		for _, col := range t.Columns {
			if t.Name == table && col.Name == c.Name {
				if raw := strings.ToLower(col.SchemaType[dialect.SQLite]); raw != "" {
					c.Type.Type = &sqlite.UserDefinedType{T: raw}
				}
				return
			}
		}
	}
}

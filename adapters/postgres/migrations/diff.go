//go:build ignore

// Command diff writes a new versioned migration for the PostgreSQL store:
// the changes that bring the migrations in this directory up to the Ent
// schema, in goose's file format, with Atlas's integrity file (atlas.sum)
// updated. Run it after changing ent/schema and regenerating ent/:
//
//	go run ./adapters/postgres/migrations/diff.go NAME
//
// It replays the existing migrations on a scratch database that it creates
// and drops on the server that LOCKS_DEV_POSTGRES names (default: the local
// server, as user postgres).
package main

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/url"
	"os"

	"ariga.io/atlas/sql/sqltool"
	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"entgo.io/ent/dialect/sql/schema"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/cleveragents/locks/ent/migrate"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: go run ./adapters/postgres/migrations/diff.go NAME")
	}
	admin := os.Getenv("LOCKS_DEV_POSTGRES")
	if admin == "" {
		admin = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	ctx := context.Background()
	adb, err := sql.Open("pgx", admin)
	if err != nil {
		log.Fatal(err)
	}
	defer adb.Close()
	scratch := fmt.Sprintf("locks_migrate_dev_%d", os.Getpid())
	if _, err := adb.ExecContext(ctx, "CREATE DATABASE "+scratch); err != nil {
		log.Fatalf("creating the scratch database: %v", err)
	}
	defer adb.ExecContext(ctx, "DROP DATABASE "+scratch)

	u, err := url.Parse(admin)
	if err != nil {
		log.Fatal(err)
	}
	u.Path = "/" + scratch
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	dir, err := sqltool.NewGooseDir("adapters/postgres/migrations")
	if err != nil {
		log.Fatalf("opening the migration directory (run from the module root): %v", err)
	}
	m, err := schema.NewMigrate(entsql.OpenDB(dialect.Postgres, db),
		schema.WithDir(dir),
		schema.WithMigrationMode(schema.ModeReplay),
		schema.WithDialect(dialect.Postgres),
		schema.WithFormatter(sqltool.GooseFormatter),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := m.NamedDiff(ctx, os.Args[1], migrate.Tables...); err != nil {
		log.Printf("writing the migration: %v", err)
	}
}

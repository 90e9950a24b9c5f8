//go:build ignore

// Command diff writes the goose migration (and atlas.sum) that brings this
// directory up to the Ent schema, after ent/ is regenerated:
//
//	go run ./adapters/postgres/migrations/diff.go NAME
//
// It replays the migrations on a scratch database of the server that
// LOCKS_DEV_POSTGRES names (default: the local one, as user postgres).
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

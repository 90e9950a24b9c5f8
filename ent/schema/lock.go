// Package schema holds the Ent schema of the lock store. It is the only
// hand-written code under ent/; everything else there is generated.
package schema

import (
	"fmt"

	"entgo.io/ent"
	"entgo.io/ent/dialect"
	"entgo.io/ent/dialect/entsql"
	"entgo.io/ent/schema"
	"entgo.io/ent/schema/field"
	"entgo.io/ent/schema/index"
)

// Lock is one row of the locks table. Times are stored as fixed-width
// ISO-8601 UTC strings (see adapters/sqlite), so that string order is time
// order; they are strings, not Ent time fields, because the table's column
// types are part of the published schema.
type Lock struct {
	ent.Schema
}

// Annotations names the table.
func (Lock) Annotations() []schema.Annotation {
	return []schema.Annotation{entsql.Annotation{Table: "locks"}}
}

// Fields of the locks table. The auto-increment id doubles as the fencing
// token: a change of hands inserts a new row, and ids are never reused.
func (Lock) Fields() []ent.Field {
	return []ent.Field{
		field.Int64("id").Immutable(),
		field.String("owner_id").MaxLen(255).NotEmpty().SchemaType(varchar(255)),
		field.String("resource_type").MaxLen(50).NotEmpty().Immutable().SchemaType(varchar(50)),
		field.String("resource_id").MaxLen(255).NotEmpty().Immutable().SchemaType(varchar(255)),
		field.String("acquired_at").MaxLen(30).Immutable().SchemaType(varchar(30)),
		field.String("expires_at").MaxLen(30).SchemaType(varchar(30)),
		// The holder's note (domain.ValidateNote), NULL for none: added
		// after the table, nullable so that the rows and the writers of
		// earlier versions stay valid.
		field.String("note").Optional().MaxLen(256).Immutable().SchemaType(varchar(256)),
	}
}

// varchar spells out the column type on every dialect, so that the table
// reads as VARCHAR(n) everywhere (SQLite would otherwise say "text").
func varchar(n int) map[string]string {
	t := fmt.Sprintf("varchar(%d)", n)
	return map[string]string{dialect.SQLite: t, dialect.Postgres: t, dialect.MySQL: t}
}

// Indexes of the locks table: one lock per resource, and expiry lookups for
// cleanup and the stale-lock count without a table scan.
func (Lock) Indexes() []ent.Index {
	return []ent.Index{
		index.Fields("resource_type", "resource_id").Unique(),
		index.Fields("expires_at"),
		index.Fields("owner_id"),
	}
}

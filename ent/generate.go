package ent

// ./template overrides two of ent's templates so that the generated client
// does not link the migration tooling (see template/client.tmpl).
//go:generate go tool ent generate --template ./template ./schema

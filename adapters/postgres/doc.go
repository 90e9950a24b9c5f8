// Package postgres stores locks in PostgreSQL through Ent, shared by every
// process of every host on the same database. Beside package entstore's
// repository it adds one-statement writes (acquire.go, renew.go, lone.go),
// a per-resource advisory lock in Update, group commit (batch.go), releases
// without the WAL flush (commit.go) and LISTEN/NOTIFY wake-ups (wake.go).
package postgres

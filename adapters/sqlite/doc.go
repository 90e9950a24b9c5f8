// Package sqlite stores locks in a SQLite database file through Ent, on the
// pure-Go modernc.org/sqlite driver. Several processes may share the file:
// each write begins IMMEDIATE, so a read-then-write is never overtaken; a
// process's writers queue inside it first, so SQLite's unfair busy waiting
// only arbitrates between processes; and a write still busy after bounded
// retries returns a *domain.StoreError of kind StoreBusy. Raw driver errors
// never leave the package: FormatError translates them.
package sqlite

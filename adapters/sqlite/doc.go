// Package sqlite stores locks in a SQLite file through Ent and the pure-Go
// modernc.org/sqlite driver, shared by processes: writes begin IMMEDIATE, so
// a read-then-write is never overtaken, queue in the process first (SQLite's
// busy wait is unfair), and return StoreBusy after bounded retries. Raw
// driver errors never leave the package: FormatError translates them.
package sqlite

// Package sqlite stores locks in a SQLite database file through Ent, on the
// pure-Go modernc.org/sqlite driver.
//
// Several processes may share one database file. Each write runs in a
// transaction that takes SQLite's write lock when it begins (BEGIN
// IMMEDIATE), so a read-then-write can never be overtaken by another
// writer; writers of one process queue inside the process first, so SQLite's
// unfair busy waiting only arbitrates between processes; and a write that
// still finds the database busy is retried a bounded number of times before
// a *domain.StoreError of kind StoreBusy is returned. Raw driver errors never
// leave this package: FormatError translates them.
package sqlite

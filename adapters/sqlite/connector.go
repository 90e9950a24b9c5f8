package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
)

// sqliteDriver is the driver registered as "sqlite", with the
// application's functions and hooks.
var sqliteDriver = func() driver.Driver {
	db, err := sql.Open("sqlite", "")
	if err != nil {
		panic("the sqlite driver is not registered: " + err.Error())
	}
	defer db.Close()
	return db.Driver()
}()

// sideFileConnector opens each connection to the database at path (named
// by sidePath) only once SQLite's side files pass checkSQLiteSideFiles:
// SQLite would block for ever on a FIFO planted there since the store
// opened, before the driver's hooks run.
type sideFileConnector struct {
	dsn, path string
}

// Connect checks the side files, then opens a connection.
func (c sideFileConnector) Connect(context.Context) (driver.Conn, error) {
	if err := checkSQLiteSideFiles(c.path); err != nil {
		return nil, err
	}
	return sqliteDriver.Open(c.dsn)
}

func (c sideFileConnector) Driver() driver.Driver { return sqliteDriver }

// openPool returns a pool of sideFileConnector's connections.
func openPool(dsn, path string) *sql.DB {
	return sql.OpenDB(sideFileConnector{dsn: dsn, path: path})
}

package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
)

// sqliteDriver is the driver registered as "sqlite", with whatever the
// application registered on it (functions, hooks).
var sqliteDriver = func() driver.Driver {
	db, err := sql.Open("sqlite", "")
	if err != nil {
		panic("the sqlite driver is not registered: " + err.Error())
	}
	defer db.Close()
	return db.Driver()
}()

// sideFileConnector opens the connections of a pool to the database at
// path (named by sidePath), each only once SQLite's side files of the
// database pass checkSQLiteSideFiles. SQLite opens them on each new
// connection (the journal, when it exists, to look at its first byte;
// the write-ahead log), and would block for ever on a FIFO planted there
// since the store opened: the pool then fails to connect, with the
// *SideFileError, instead. The driver's own connection hooks run only
// after the connection has read the database, too late for that.
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

// Driver returns the sqlite driver.
func (c sideFileConnector) Driver() driver.Driver { return sqliteDriver }

// openPool returns a pool of connections to the database at path (named
// by sidePath) through dsn, each opened by sideFileConnector.
func openPool(dsn, path string) *sql.DB {
	return sql.OpenDB(sideFileConnector{dsn: dsn, path: path})
}

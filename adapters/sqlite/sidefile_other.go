//go:build !unix

package sqlite

import "io/fs"

// dbOwner: this system has no owner to compare with.
type dbOwner struct{}

func ownerOf(string) dbOwner { return dbOwner{} }

// foreignOwner cannot tell on this system.
func foreignOwner(fs.FileInfo, dbOwner) string { return "" }

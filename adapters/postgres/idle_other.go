//go:build !unix

package postgres

// spoke cannot peek at a socket here: the driver's ping, past a second of idleness, is the only check.
func (c *poolConn) spoke() bool { return false }

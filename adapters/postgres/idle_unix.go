//go:build unix

package postgres

import (
	"errors"
	"syscall"
)

// spoke reports whether the server sent something on c, or closed it,
// while it sat idle: a peek that never waits. An idle connection hears
// nothing but a terminated backend's FATAL before its end of file.
func (c *poolConn) spoke() bool {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	spoke := false
	var b [1]byte
	err = raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// n > 0: a message waits; n == 0 without error: its end of file;
		// an error but "nothing yet": the connection is reset.
		spoke = n > 0 || err == nil || !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR)
		return true // done: never wait for the socket to be readable
	})
	return spoke || err != nil
}

//go:build linux

package sqlite

import (
	"time"

	"golang.org/x/sys/unix"
)

// FailInotifyInit makes every opening of an inotify instance fail with
// err, as where the user's instances are all taken, until restore.
func FailInotifyInit(err error) (restore func()) {
	inotifyInit = func(int) (int, error) { return -1, err }
	return func() { inotifyInit = unix.InotifyInit1 }
}

// WakeSlot is the slot of ref in the wake file.
var WakeSlot = wakeSlot

// WakeCountsAt is where the wake file's watch counts begin.
const WakeCountsAt = wakeCountsAt

// RecheckEvery sets how often a store looks at the wake file's path when
// nothing tells it to, until restore.
func RecheckEvery(d time.Duration) (restore func()) {
	old := wakeRecheck
	wakeRecheck = d
	return func() { wakeRecheck = old }
}

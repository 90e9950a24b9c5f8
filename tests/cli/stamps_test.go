package cli

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// envWriteStamps makes the test binary a command that ignores SIGTERM and
// appends, every half millisecond, the wall-clock time at which it writes
// (Unix nanoseconds, 8 bytes little-endian, one write each) to the file it
// names, after writing its pid to its first argument: a command whose
// every write the lock must cover, until SIGKILL.
const envWriteStamps = "AGENTS_TEST_WRITE_STAMPS"

func writeStamps(path, pidFile string) int {
	signal.Ignore(syscall.SIGTERM)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ready := false
	for {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(time.Now().UnixNano()))
		if _, err := f.Write(b[:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if !ready {
			ready = true
			if err := os.WriteFile(pidFile, fmt.Appendf(nil, "%d\n", os.Getpid()), 0o600); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// lastStamp returns the time of the last write of a writeStamps command.
func lastStamp(path string) (time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	if len(b) < 8 || len(b)%8 != 0 {
		return time.Time{}, fmt.Errorf("%s holds %d bytes, not whole stamps", path, len(b))
	}
	return time.Unix(0, int64(binary.LittleEndian.Uint64(b[len(b)-8:]))), nil
}

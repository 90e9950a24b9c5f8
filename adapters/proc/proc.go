// Package proc identifies this machine's processes and tells, from
// Linux's /proc, whether one is gone: the adapter of
// application.Processes. Elsewhere no process is ever proven gone.
package proc

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Root is where the proc file system is mounted.
const Root = "/proc"

// Machine is this machine as /proc shows it.
type Machine struct {
	Host         string
	BootID       string
	PIDNamespace uint64
}

var _ application.Processes = (*Machine)(nil)

// ThisMachine returns this machine, read from /proc once per process.
//
// Errors: when /proc cannot be read (another system, a sandbox).
var ThisMachine = sync.OnceValues(func() (*Machine, error) {
	boot, err := os.ReadFile(Root + "/sys/kernel/random/boot_id")
	if err != nil {
		return nil, err
	}
	link, err := os.Readlink(Root + "/self/ns/pid") // "pid:[4026531836]"
	if err != nil {
		return nil, err
	}
	ns, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]"), 10, 64)
	if err != nil {
		return nil, err
	}
	return &Machine{Host: Hostname(), BootID: strings.TrimSpace(string(boot)), PIDNamespace: ns}, nil
})

// Hostname returns this host's name as owner ids carry it: valid UTF-8,
// at most 150 bytes, without domain.ProcessOwner's separators.
func Hostname() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	if len(host) > 150 {
		host = host[:150]
	}
	host = strings.ToValidUTF8(host, "?") // the cut may split a character
	return strings.NewReplacer("/", "_", ":", "_").Replace(host)
}

// Owner returns the owner id of process pid of this machine.
//
// Errors: when its start time cannot be read.
func (m *Machine) Owner(pid int) (domain.ProcessOwner, error) {
	start, _, err := stat(pid)
	if err != nil {
		return domain.ProcessOwner{}, err
	}
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	return domain.ProcessOwner{Host: m.Host, PID: pid, Nonce: hex.EncodeToString(nonce[:]),
		BootID: m.BootID, PIDNamespace: m.PIDNamespace, StartTime: start}, nil
}

// Gone implements application.Processes.
func (m *Machine) Gone(p domain.ProcessOwner) bool {
	if p.Host != m.Host || p.BootID != m.BootID || p.PIDNamespace != m.PIDNamespace {
		return false // another machine, another boot, or another container
	}
	// A member of the owner's group, even one hidepid hides or a zombie,
	// keeps it alive; a group id is not reused while it has members.
	return processGone(p) && (p.Group == 0 || noSuchProcess(-p.Group))
}

// processGone reports whether the process p names is provably gone.
func processGone(p domain.ProcessOwner) bool {
	start, state, err := stat(p.PID)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// hidepid=1/2 hides other users' processes: only kill(2) tells.
		return noSuchProcess(p.PID)
	case err != nil:
		return false // cannot tell
	case start != p.StartTime:
		return true // the pid belongs to a later process now
	}
	return state == 'Z' || state == 'X' // exited; a stopped process (T, t) is alive
}

// stat returns the start time and the state of process pid.
func stat(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", Root, pid))
	if err != nil {
		return 0, 0, err
	}
	// Field 2, the command name in parentheses, may contain anything.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	var fields []string
	if i >= 0 {
		fields = strings.Fields(s[i+1:])
	}
	if len(fields) < 20 || len(fields[0]) != 1 {
		return 0, 0, fmt.Errorf("unexpected %s/%d/stat", Root, pid)
	}
	// fields[0] is field 3, the state; fields[19] is field 22, starttime.
	start, err = strconv.ParseUint(fields[19], 10, 64)
	return start, fields[0][0], err
}

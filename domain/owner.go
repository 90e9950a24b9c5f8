package domain

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ProcessOwner is an owner id that names one process of one machine well
// enough to prove it gone: the host, the kernel's boot id (a reboot starts
// a new one), the pid namespace (another container has its own), the pid
// and the process's start time (a reused pid starts later). Containers
// use it as their default owner; an explicit owner id ("alice",
// "session-42") never parses as one, so it is never taken over early.
//
// Its text form keeps "host:pid:nonce" first, for people, and adds the
// proof after a versioned marker:
//
//	host:pid:nonce/proc1:boot-id:pid-namespace:start-time
//
// An owner whose work runs in a process group of its own ("agents locks
// run" and its command) names the group too, after a "g":
//
//	host:pid:nonce/proc1:boot-id:pid-namespace:start-time:gPGID
//
// Such an owner is gone only once the process and every member of the
// group are. A reader that predates the group (and so does not parse it)
// takes the id for an explicit owner's, which is never taken over early.
type ProcessOwner struct {
	Host         string
	PID          int
	Nonce        string // 8 hex digits, so that two owners never collide
	BootID       string // /proc/sys/kernel/random/boot_id
	PIDNamespace uint64 // the inode of /proc/self/ns/pid
	StartTime    uint64 // clock ticks after boot, /proc/PID/stat field 22
	// Group is the id of the process group that does the owner's work,
	// whose members count as the owner while any is alive; 0 for none.
	Group int
}

var processOwnerPattern = regexp.MustCompile(
	`^([^/]+):([0-9]+):([0-9a-f]{8})/proc1:([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}):([0-9]+):([0-9]+)(?::g([0-9]+))?$`)

// String returns the owner id.
func (p ProcessOwner) String() string {
	s := fmt.Sprintf("%s:%d:%s/proc1:%s:%d:%d", p.Host, p.PID, p.Nonce, p.BootID, p.PIDNamespace, p.StartTime)
	if p.Group > 0 {
		s += ":g" + strconv.Itoa(p.Group)
	}
	return s
}

// ParseProcessOwner parses an owner id written by ProcessOwner.String. It
// accepts nothing else: any other id is an owner that carries no process.
func ParseProcessOwner(owner string) (ProcessOwner, bool) {
	if !strings.Contains(owner, "/proc1:") {
		return ProcessOwner{}, false // most owners: no need for the pattern
	}
	m := processOwnerPattern.FindStringSubmatch(owner)
	if m == nil {
		return ProcessOwner{}, false
	}
	pid, err1 := strconv.Atoi(m[2])
	ns, err2 := strconv.ParseUint(m[5], 10, 64)
	start, err3 := strconv.ParseUint(m[6], 10, 64)
	group := 0
	var err4 error
	if m[7] != "" {
		if group, err4 = strconv.Atoi(m[7]); err4 == nil && group <= 0 {
			err4 = strconv.ErrRange
		}
	}
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || pid <= 0 {
		return ProcessOwner{}, false
	}
	return ProcessOwner{Host: m[1], PID: pid, Nonce: m[3], BootID: m[4], PIDNamespace: ns, StartTime: start, Group: group}, true
}

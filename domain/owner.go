package domain

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ProcessOwner is an owner id that names one process of one machine well
// enough to prove it gone (boot id, pid namespace, start time against a
// reused pid), after "host:pid:nonce" for people, with the process group
// doing the owner's work, if any:
//
//	host:pid:nonce/proc1:boot-id:pid-namespace:start-time[:gPGID]
//
// An explicit owner id ("alice") never parses as one, so it is never taken
// over early; nor is a group id, to a reader older than the group.
type ProcessOwner struct {
	Host         string
	PID          int
	Nonce        string // 8 hex digits, so that two owners never collide
	BootID       string // /proc/sys/kernel/random/boot_id
	PIDNamespace uint64 // the inode of /proc/self/ns/pid
	StartTime    uint64 // clock ticks after boot, /proc/PID/stat field 22
	Group        int    // a process group whose live members keep the owner alive; 0 for none
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

// ParseProcessOwner parses an owner id written by ProcessOwner.String, and nothing else.
func ParseProcessOwner(owner string) (ProcessOwner, bool) {
	if !strings.Contains(owner, "/proc1:") {
		return ProcessOwner{}, false // most owners, without the regexp
	}
	m := processOwnerPattern.FindStringSubmatch(owner)
	if m == nil {
		return ProcessOwner{}, false
	}
	pid, err1 := strconv.Atoi(m[2])
	ns, err2 := strconv.ParseUint(m[5], 10, 64)
	start, err3 := strconv.ParseUint(m[6], 10, 64)
	group, err4 := 0, error(nil)
	if m[7] != "" {
		group, err4 = strconv.Atoi(m[7])
	}
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || pid <= 0 || (m[7] != "" && group <= 0) {
		return ProcessOwner{}, false
	}
	return ProcessOwner{Host: m[1], PID: pid, Nonce: m[3], BootID: m[4], PIDNamespace: ns, StartTime: start, Group: group}, true
}

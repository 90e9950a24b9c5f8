package main

import (
	"encoding/binary"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The keeper enforces the lock's lease itself: agents tells it, over the
// pipe that is the keeper's stdin, when the lock expires (as an instant on
// CLOCK_BOOTTIME, which both processes read alike and which runs on while
// the machine sleeps), and beats while it runs. Should agents be stopped
// or frozen (SIGSTOP, a cgroup freeze, a debugger, a machine swapping), it
// renews nothing, and nothing else would stop the command before another
// owner takes the lock: the keeper then stops the group as agents would
// on a loss (SIGTERM, then SIGKILL after --grace), and says so on its
// stdout.
//
// The messages of agents, each written whole (they are shorter than
// PIPE_BUF, so never interleaved):
//
//	'd'                          agents is done: exit, leaving the group be
//	'h' sent                     agents runs (sent: its CLOCK_BOOTTIME)
//	'l' expiry lead kill grace   the lease, on every acquisition and renewal
//
// as little-endian int64 nanoseconds; EOF before 'd' means agents died.
// The keeper writes 'r' once it is ready, and 'e', its CLOCK_BOOTTIME and
// when it will SIGKILL what is left (the same clock) when it stops the
// group: agents says when, which is not always --grace later.
const (
	msgDone  = 'd'
	msgBeat  = 'h'
	msgLease = 'l'
	leaseLen = 1 + 4*8
	beatLen  = 1 + 8
	stopLen  = 1 + 2*8
)

// heartbeat is how often agents beats; beatWindow how long a keeper waits
// without a beat before it takes agents for stopped. The window is long
// enough for a loaded machine to delay a beat or two: a live agents
// whose renewal is late (a store that fails for a while) keeps its lock
// until the expiry, as the keep-alive promises; only a silent one is
// stopped ahead of it.
const (
	heartbeat  = 250 * time.Millisecond
	beatWindow = time.Second
)

// leaseLead is how long before the lock's expiry the keeper stops the
// group of a silent agents: long enough for a command to act on SIGTERM
// before another owner may take the lock, and short enough that a
// renewal at TTL/2 always comes first (a fifth of the TTL, at most 2 s).
func leaseLead(ttl time.Duration) time.Duration { return min(ttl/5, 2*time.Second) }

// killLead is how long before the lock's expiry the keeper SIGKILLs what
// is left of a silent agents' group, whatever --grace says: another owner
// may take the lock at the expiry itself, so the kill must land before
// it, not on it. It covers the keeper's own lateness (a poll that wakes
// late on a loaded machine, the kernel delivering SIGKILL to every
// member) with room to spare: a twentieth of the TTL, at least 200 ms,
// and never more than half the lead, so that SIGTERM always comes first
// (250 ms for a 5 s lock, 1 s from a 20 s one on).
func killLead(ttl time.Duration) time.Duration {
	return min(max(ttl/20, 200*time.Millisecond), leaseLead(ttl)/2)
}

// bootNow reads CLOCK_BOOTTIME, in nanoseconds.
func bootNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Linux has had it since 2.6.39; CLOCK_MONOTONIC is the same but
		// for the time spent asleep.
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	}
	return ts.Nano()
}

// lease tells the keeper when the lock, of TTL ttl, expires: left() is
// what remains of it on agents' clock, read after the keeper's clock so
// that a pause in between shortens the lease rather than lengthens it.
// grace is the --grace between the keeper's SIGTERM and its SIGKILL. The
// first lease starts the heartbeat. It does nothing once close has begun.
func (g *group) lease(left func() time.Duration, ttl, grace time.Duration) {
	if g == nil {
		return
	}
	lead, kill := leaseLead(ttl), killLead(ttl)
	now := bootNow()
	expiry := now + int64(left())
	var msg [leaseLen]byte
	msg[0] = msgLease
	binary.LittleEndian.PutUint64(msg[1:], uint64(expiry))
	binary.LittleEndian.PutUint64(msg[9:], uint64(lead))
	binary.LittleEndian.PutUint64(msg[17:], uint64(kill))
	binary.LittleEndian.PutUint64(msg[25:], uint64(grace))
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.leases == nil {
		return // closing
	}
	select {
	case <-g.leases: // an older lease that was not sent yet: this one replaces it
	default:
	}
	g.leases <- msg
	if !g.beating {
		g.beating = true
		g.writing.Add(1)
		go g.write(g.done, g.leases, g.stopWrite)
	}
}

// write sends the leases, in order, and a beat every heartbeat (none when
// g.beat is zero, as a test of a silent agents sets it), until stop is
// closed. A write that blocks (a stopped keeper, whose pipe is full)
// holds up no renewal.
func (g *group) write(w *os.File, leases <-chan [leaseLen]byte, stop <-chan struct{}) {
	defer g.writing.Done()
	var tick <-chan time.Time
	if g.beat > 0 {
		t := time.NewTicker(g.beat)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case msg := <-leases:
			_, _ = w.Write(msg[:])
		case <-tick:
			var msg [beatLen]byte
			msg[0] = msgBeat
			binary.LittleEndian.PutUint64(msg[1:], uint64(bootNow()))
			_, _ = w.Write(msg[:])
		case <-stop:
			return
		}
	}
}

// hear reads what the keeper says: 'r' once it is ready (sent on readyc),
// then 'e' if it stops the group (lapsed), until it exits.
func (g *group) hear(r *os.File, readyc chan<- bool) {
	defer close(g.heard)
	defer r.Close()
	var b [stopLen]byte
	n, _ := r.Read(b[:1])
	readyc <- n == 1 && b[0] == 'r'
	if _, err := io.ReadFull(r, b[:]); err != nil || b[0] != 'e' {
		return // done, or gone
	}
	g.mu.Lock()
	g.lapsedAt = int64(binary.LittleEndian.Uint64(b[1:]))
	g.lapsedKill = int64(binary.LittleEndian.Uint64(b[9:]))
	g.mu.Unlock()
	close(g.lapsed)
	_, _ = io.Copy(io.Discard, r) // until it exits
}

// mark records that agents itself is stopping the group, now.
func (g *group) mark() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stoppedAt == 0 {
		g.stoppedAt = bootNow()
	}
}

// keeperKillIn returns how long after its SIGTERM the keeper SIGKILLs
// what is left of the group it stopped: --grace, or less when it stopped
// a silent agents' group ahead of the lock's expiry (the SIGKILL lands a
// margin before the expiry); grace before the keeper has said.
func (g *group) keeperKillIn(grace time.Duration) time.Duration {
	if g == nil {
		return grace
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lapsedAt == 0 {
		return grace
	}
	return time.Duration(max(g.lapsedKill-g.lapsedAt, 0))
}

// keeperFirst reports whether the keeper stopped the group (for want of
// a renewal) before agents did (mark), if agents did.
func (g *group) keeperFirst() bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lapsedAt != 0 && (g.stoppedAt == 0 || g.lapsedAt <= g.stoppedAt)
}

// keep is the keeper: it waits for agents to say it is done, or to die,
// and then kills the group, itself included; meanwhile it stops the group
// if the lock's lease runs out (see above). It ignores the signals that
// agents forwards to the group: they are for the command. If the group
// has the terminal, a stop from it (Ctrl-Z) stops agents' group too.
func keep() int {
	// SIGTSTP, SIGTTIN and SIGTTOU are ignored too (or caught, below):
	// they would stop the keeper, and a stopped keeper guards nothing;
	// agents treats it as gone (see group.watch). SIGSTOP cannot be
	// ignored, which is why agents watches. SIGPIPE: a dead agents does
	// not hear of a stop, and must not kill the keeper with it.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGPIPE)
	if os.Getenv(keeperForeground) != "" {
		stops := make(chan os.Signal, 1)
		signal.Notify(stops, syscall.SIGTSTP)
		if agents, err := syscall.Getpgid(os.Getppid()); err == nil {
			go func() {
				for range stops {
					_ = syscall.Kill(-agents, syscall.SIGTSTP)
				}
			}()
		}
	}
	_, _ = syscall.Write(1, []byte{'r'}) // ready: see startGroup
	k := lease{beat: bootNow()}
	var buf []byte
	b := make([]byte, 512)
	for {
		timeout := k.step(bootNow())
		fds := []unix.PollFd{{Fd: 0, Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, timeout); err != nil && err != unix.EINTR {
			break
		}
		if fds[0].Revents == 0 {
			continue
		}
		n, err := syscall.Read(0, b)
		if err == syscall.EINTR || err == syscall.EAGAIN {
			continue
		}
		if n <= 0 {
			break // agents has died
		}
		buf = append(buf, b[:n]...)
		var done bool
		if buf, done = k.read(buf); done {
			return 0
		}
	}
	_ = syscall.Kill(0, syscall.SIGKILL)
	return 1
}

// lease is what the keeper knows of the lock, in CLOCK_BOOTTIME
// nanoseconds: zero expiry before the first lease.
type lease struct {
	// lead is how long before the expiry a silent agents' group gets
	// SIGTERM (leaseLead), kill how long before it SIGKILL (killLead).
	expiry, lead, kill, grace int64
	// beat is when agents last beat (or the keeper started).
	beat int64
	// termAt is when the keeper sent SIGTERM to the group; zero before.
	// killAt is when it SIGKILLs what is left: grace later, but no later
	// than kill before the expiry when it stopped the group ahead of it
	// (a silent agents cannot renew, and another owner may take the lock
	// at the expiry).
	termAt, killAt int64
	// cleared is set once no member is left after the SIGKILL.
	cleared bool
}

// read applies the whole messages at the start of buf and returns what is
// left of it, and whether agents said it is done.
func (k *lease) read(buf []byte) ([]byte, bool) {
	for len(buf) > 0 {
		switch buf[0] {
		case msgDone:
			return nil, true
		case msgBeat:
			if len(buf) < beatLen {
				return buf, false
			}
			k.beat = max(k.beat, int64(binary.LittleEndian.Uint64(buf[1:])))
			buf = buf[beatLen:]
		case msgLease:
			if len(buf) < leaseLen {
				return buf, false
			}
			k.expiry = int64(binary.LittleEndian.Uint64(buf[1:]))
			k.lead = int64(binary.LittleEndian.Uint64(buf[9:]))
			k.kill = int64(binary.LittleEndian.Uint64(buf[17:]))
			k.grace = int64(binary.LittleEndian.Uint64(buf[25:]))
			buf = buf[leaseLen:]
		default:
			return nil, false // not agents' words: ignored
		}
	}
	return buf, false
}

// step stops the group if the lease has run out at now, SIGKILLs what is
// left of it grace later, and returns how long to wait, in milliseconds,
// before the next step: at most a second, so that a machine that slept
// (CLOCK_BOOTTIME ran on, the poll's clock did not) is caught up with
// soon after it wakes.
func (k *lease) step(now int64) int {
	next := now + int64(time.Second)
	switch {
	case k.expiry == 0 || k.cleared:
	case k.termAt == 0:
		// A silent agents (stopped, frozen) loses the lead; a live one,
		// whose renewal is late, keeps the lock until its expiry, where
		// the keep-alive declares it lost itself.
		soft := k.expiry - k.lead
		silentAt := max(soft, k.beat+int64(beatWindow))
		if now >= k.expiry || now >= silentAt {
			k.termAt, k.killAt = now, now+k.grace
			if now < k.expiry {
				// Silent: SIGKILL lands ahead of the expiry, at once if
				// the keeper woke too late for that.
				k.killAt = max(min(k.killAt, k.expiry-k.kill), now)
			}
			var msg [stopLen]byte
			msg[0] = 'e'
			binary.LittleEndian.PutUint64(msg[1:], uint64(now))
			binary.LittleEndian.PutUint64(msg[9:], uint64(k.killAt))
			_, _ = syscall.Write(1, msg[:]) // before the signal: agents learns why its command ended, and when it is killed
			_ = syscall.Kill(0, syscall.SIGTERM)
			_ = syscall.Kill(0, syscall.SIGCONT) // a stopped member must act on it
			next = min(next, k.killAt)
		} else {
			next = min(next, k.expiry, silentAt)
		}
	case now >= k.killAt:
		pids := groupMembers(os.Getpid())
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		k.cleared = len(pids) == 0
		next = min(next, now+int64(10*time.Millisecond))
	default:
		next = min(next, k.killAt)
	}
	return int(max((next-now+int64(time.Millisecond)-1)/int64(time.Millisecond), 0))
}

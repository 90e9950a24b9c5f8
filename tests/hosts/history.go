package hosts

import "time"

// Kinds of Event. A host writes all but the last; the harness writes the
// faults it injected.
const (
	// KindStarted: a process started; Err says its hostname and pid as it
	// sees them (its own UTS and PID namespaces: "hostname h1 pid 2").
	KindStarted = "started"
	// KindAcquired: the service took a lock for this process (Token,
	// Expires as stored).
	KindAcquired = "acquired"
	// KindRenewed: a renewal of the lock with Token committed (Expires).
	KindRenewed = "renewed"
	// KindReleased: the lock with Token was released by its holder.
	KindReleased = "released"
	// KindLost: the keep-alive's context of the lock with Token ended with
	// a loss while the work still ran.
	KindLost = "lost"
	// KindBelief: just before At, the holder of Token still believed it
	// held the lock (its keep-alive's context had not ended).
	KindBelief = "belief"
	// KindWrite: a fenced write with Token finished (Outcome, Attempt).
	KindWrite = "write"
	// KindFault: the harness injected Fault on Host ("" for every host,
	// a server restart) from At to End.
	KindFault = "fault"
)

// Outcomes of a KindWrite event.
const (
	Committed = "committed" // the commit returned nil
	Refused   = "refused"   // the fence refused it: nothing was written
	Unknown   = "unknown"   // the commit failed: it may have committed
	Failed    = "failed"    // failed before the commit: nothing was written
)

// Fault kinds.
const (
	FaultPartition = "partition" // the host's veth down
	FaultPause     = "pause"     // SIGSTOP past the TTL, then SIGCONT
	FaultKill      = "kill"      // SIGKILL, and a new process on the host
	FaultClock     = "clock"     // the host's injected clock stepped
	FaultRestart   = "restart"   // the server stopped (immediate) and started
	FaultLatency   = "latency"   // the host's proxy delays every packet
	FaultBlackhole = "blackhole" // the host's proxy forwards nothing
	FaultReset     = "reset"     // the host's proxy resets its connections
)

// AllFaults are the fault kinds a short run injects at least once each.
var AllFaults = []string{FaultPartition, FaultPause, FaultKill, FaultClock,
	FaultRestart, FaultLatency, FaultBlackhole, FaultReset}

// Event is one line of the history. Times are the machine's real time:
// the hosts are namespaces of one kernel, which is also the server's, so
// it is the server's clock (clock_timestamp()) without a round trip, and
// no host's injected clock takes part in it.
type Event struct {
	Kind     string    `json:"kind"`
	Host     string    `json:"host,omitempty"`
	Owner    string    `json:"owner,omitempty"`
	Resource string    `json:"res,omitempty"`
	Token    int64     `json:"token,omitempty"`
	At       time.Time `json:"at"`
	End      time.Time `json:"end,omitzero"`     // a fault's end
	Expires  time.Time `json:"expires,omitzero"` // the lock's expiry as stored
	// Stored is the acquisition time that the store wrote with an
	// acquired lock: the server's time of the decision to grant it.
	Stored time.Time `json:"stored,omitzero"`
	// DeadHolder: the acquisition took over the active lock of a process
	// of the same host that was gone (a killed process), as it may.
	DeadHolder bool   `json:"dead_holder,omitempty"`
	Outcome    string `json:"outcome,omitempty"`
	Attempt    string `json:"attempt,omitempty"` // a write's id, as in Row
	Fault      string `json:"fault,omitempty"`
	Err        string `json:"err,omitempty"`
	// Uncertainty is how uncertain the host's estimate of the server's
	// time was, as its clock said (half the fastest round trip of its last
	// measurement): the documented error of the expiry it decides on.
	Uncertainty time.Duration `json:"uncertainty,omitempty"`
	// Skew is the host's estimate of the server's time minus the real
	// time, at At.
	Skew time.Duration `json:"skew,omitempty"`
	// Estimate is the host's estimate of the server's time, read between
	// the real times EstimateFrom and EstimateTo: the estimate is right,
	// within its stated Uncertainty, if it falls between the two widened
	// by it (the bracket keeps a host stopped between the readings from
	// counting as an error).
	Estimate     time.Time `json:"estimate,omitzero"`
	EstimateFrom time.Time `json:"estimate_from,omitzero"`
	EstimateTo   time.Time `json:"estimate_to,omitzero"`
	// Clock is a KindClock event's reading of the host's injected wall
	// clock.
	Clock time.Time `json:"clock,omitzero"`
}

// Row is a write that the server committed: a row of the writes table,
// which every fenced transaction appends to inside its transaction.
type Row struct {
	ID       int64 // the table's serial: the order of the inserts
	Kind     string
	Resource string
	Token    int64
	Owner    string
	Attempt  string
	At       time.Time // the server's clock_timestamp() in the transaction
}

// Ops of a Change.
const (
	ChangeGrant  = "grant"  // a lock's row inserted: its token granted
	ChangeExtend = "extend" // its expiry updated: a renewal or a re-entry
	ChangeDelete = "delete" // its row deleted: a release, a purge or a takeover
)

// Change is a change of the locks table as the server recorded it, by a
// trigger, inside the changing transaction: the server's own account of
// every grant, renewal and deletion, whether or not a host lived to
// report it, and at the server's time of the change rather than when a
// host heard of it.
type Change struct {
	ID       int64 // the log's serial: the order of the changes
	Op       string
	Resource string
	Token    int64
	Owner    string
	Acquired time.Time // the row's acquisition time: the grant's decision, on its taker's estimate
	Expires  time.Time // the row's expiry after the change (a delete: before it)
	Tx       int64     // the transaction: a delete and a grant in one are a takeover
	At       time.Time // the server's clock_timestamp() in the trigger
}

// Tables is what the checker reads from the database after the run.
type Tables struct {
	Rows     []Row
	Counters map[string]int64 // plan resource ("plan/p1") → its counter
	// Changes is the locks table's log; empty, the rules that need it
	// are not applied.
	Changes []Change
}

// Violation is one broken promise.
type Violation struct {
	Kind   string
	Detail string
}

// The kinds of Violation.
const (
	VOverlap       = "overlap"              // two holders of one resource at once
	VEarlyTakeover = "early-takeover"       // a lock granted before the previous one expired on the server
	VStaleWrite    = "write-after-takeover" // a fenced write landed after a newer token's acquisition
	VCounter       = "counter"              // a plan's counter is not its committed transitions
	VRefusedWrote  = "refused-but-written"  // a write the host was told was refused is in the table
	VLostWrite     = "committed-but-absent" // a write the host was told committed is not
	VTokenOrder    = "token-order"          // tokens not strictly increasing per resource
	VLateLoss      = "late-loss"            // a holder told of its loss after expiry + bound
	VNoRecovery    = "no-recovery"          // a host that did not commit again after a fault
	VWriteReleased = "write-after-release"  // a fenced write landed after its own lock was gone
	VEstimate      = "estimate-off"         // a host's estimate of the server's time outside its stated uncertainty
	VLinear        = "not-linearizable"     // the server's changes, or a host's view of them, not a single lock's
	VRemoved       = "removed-while-held"   // a lock deleted before its expiry, not by its holder, while it held it
)

// Limits are the bounds the checker holds the run to.
type Limits struct {
	// LossBound: a holder cut off from the server learns of its loss no
	// later than the lock's expiry plus this, plus the uncertainty of its
	// estimate of the server's time (docs/operations.md: half the fastest
	// round trip of its last measurement), which the host reports with
	// the loss. LossBound itself is the scheduling of a loaded machine.
	LossBound time.Duration
	// Recovery: every host commits a write within this of a fault's end
	// (unless another fault on it starts first, or the run ends).
	Recovery time.Duration
	// PauseSlack widens a pause on both sides: a claim that overlaps it is
	// not held to the overlap and loss rules, which a stopped process
	// cannot keep (its fenced writes still can, and are checked).
	PauseSlack time.Duration
	// EventSlack is how long after a commit its event may be recorded at
	// most, and so how much earlier than its record a decision is taken
	// to have begun when the checker needs one before it.
	EventSlack time.Duration
	// EstimateSlack widens the uncertainty a host states for its estimate
	// of the server's time: the drift of its monotonic clock between
	// measurements, and the server's microsecond readings.
	EstimateSlack time.Duration
}

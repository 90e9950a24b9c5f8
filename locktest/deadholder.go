package locktest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// handOver is a prober that, while it probes, lets the resource change
// hands; it then says the probed holder is gone, as it is.
type handOver struct{ during func() }

func (h *handOver) Gone(domain.ProcessOwner) bool { h.during(); return true }

// testDeadHolder checks the window of the dead-holder takeover: its probe
// runs outside the write, so the row may change hands while it runs. The
// takeover must then decide on the row it writes, and never remove the
// lock of the new holder, who is alive.
func testDeadHolder(t *testing.T, newRepo NewRepository) {
	dead := domain.ProcessOwner{Host: "h", PID: 7, Nonce: "0a1b2c3d",
		BootID: "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", PIDNamespace: 1, StartTime: 9}.String()
	for _, tc := range []struct {
		name string
		// next is who holds the lock once the probe has run.
		next string
	}{
		{"AnotherOwnerTookIt", "C"},
		{"TheDeadOwnerIdTookItAgain", dead},
	} {
		run(t, "RowChangesHandsDuringProbe/"+tc.name, func(t *testing.T) {
			probe := &handOver{}
			f := mustFixture(t, newRepo, application.WithProcesses(probe))
			held := f.MustAcquire(t, dead, plan1, time.Hour)
			var next domain.Lock
			probes := 0
			probe.during = func() {
				probes++
				released, err := f.Svc.Release(f.Ctx, dead, plan1)
				require.NoError(t, err)
				require.True(t, released)
				f.Clock.Add(time.Second)
				next = f.MustAcquire(t, tc.next, plan1, time.Hour)
			}

			_, err := f.Svc.Acquire(f.Ctx, "B", plan1, 0)
			require.Equal(t, 1, probes, "the dead holder was probed")
			var conflict *domain.LockConflictError
			require.ErrorAs(t, err, &conflict, "B is refused: the lock changed hands during the probe")
			assert.Equal(t, next, conflict.Holder, "the refusal names the new holder")
			assert.Greater(t, next.Token, held.Token)
			assert.Equal(t, []domain.Lock{next}, f.All(t), "the new holder's lock is whole")
		})
	}
}

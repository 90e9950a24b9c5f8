package telemetry

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// ScopeName is the instrumentation scope of the module's metrics.
const ScopeName = "github.com/cleveragents/locks"

// Metrics records lock events as the locks.* OpenTelemetry instruments that docs/operations.md lists.
type Metrics struct {
	events, takeovers, cleaned metric.Int64Counter
	acquire, hold, wait        metric.Float64Histogram
	active                     metric.Registration
}

var _ application.Observer = (*Metrics)(nil)

// NewMetrics creates the instruments on mp's meter. active, when not nil,
// counts the active locks for the locks.active gauge; Close unregisters it.
func NewMetrics(mp metric.MeterProvider, active func(context.Context) (int, error)) (*Metrics, error) {
	meter := mp.Meter(ScopeName)
	m := &Metrics{}
	var errs [6]error
	m.events, errs[0] = meter.Int64Counter("locks.events", metric.WithDescription("Lock events, by event and resource type."))
	m.takeovers, errs[1] = meter.Int64Counter("locks.takeovers", metric.WithDescription("Expired locks taken over by a new owner."))
	m.cleaned, errs[2] = meter.Int64Counter("locks.cleanup.removed", metric.WithDescription("Expired locks purged by cleanup."))
	m.acquire, errs[3] = meter.Float64Histogram("locks.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of acquire calls (one try each), by outcome."))
	m.wait, errs[4] = meter.Float64Histogram("locks.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of whole waits for a lock held by another owner, by outcome."))
	m.hold, errs[5] = meter.Float64Histogram("locks.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("How long locks released through a handle were held."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	if active != nil {
		gauge, err := meter.Int64ObservableGauge("locks.active", metric.WithDescription("Locks active in the store."))
		if err != nil {
			return nil, err
		}
		m.active, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
			n, err := active(ctx)
			if errors.Is(err, domain.ErrClosed) {
				return nil // the container is closing
			}
			if err == nil {
				o.ObserveInt64(gauge, int64(n))
			}
			return err
		}, gauge)
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Close unregisters the active-locks callback.
func (m *Metrics) Close() error {
	if m.active == nil {
		return nil
	}
	return m.active.Unregister()
}

// Observe implements application.Observer.
func (m *Metrics) Observe(ctx context.Context, e application.Event) {
	attrs := metric.WithAttributes(attribute.String("event", e.Kind.String()), attribute.String("resource_type", string(e.Resource.Type)))
	m.events.Add(ctx, 1, attrs)
	switch e.Kind {
	case application.EventAcquired, application.EventReentered, application.EventTakenOver, application.EventRefused:
		m.acquire.Record(ctx, e.Took.Seconds(), metric.WithAttributes(attribute.String("outcome", e.Kind.String())))
		if e.Kind == application.EventTakenOver {
			m.takeovers.Add(ctx, 1, metric.WithAttributes(attribute.String("resource_type", string(e.Resource.Type))))
		}
	case application.EventReleased:
		if e.HeldFor > 0 {
			m.hold.Record(ctx, e.HeldFor.Seconds())
		}
	case application.EventCleanedUp:
		m.cleaned.Add(ctx, int64(e.Count))
	case application.EventWaited:
		outcome := "acquired"
		if e.Err != nil {
			outcome = "gave_up"
		}
		m.wait.Record(ctx, e.Took.Seconds(), metric.WithAttributes(attribute.String("outcome", outcome)))
	}
}

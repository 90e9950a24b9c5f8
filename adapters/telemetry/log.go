// Package telemetry shows the lock service's events in log/slog and
// OpenTelemetry: the adapters of application.Observer.
package telemetry

import (
	"context"
	"log/slog"
	"time"

	"github.com/cleveragents/locks/application"
)

// Logger writes every lock event to a *slog.Logger: changes of hands,
// releases and cleanups at Info, failed renewals and losses at Warn, and
// the frequent ones (re-entries, renewals, refusals) at Debug.
type Logger struct{ log *slog.Logger }

var _ application.Observer = (*Logger)(nil)

// NewLogger returns the observer that logs to log.
func NewLogger(log *slog.Logger) *Logger { return &Logger{log: log} }

// Observe implements application.Observer.
func (l *Logger) Observe(ctx context.Context, e application.Event) {
	level := slog.LevelInfo
	switch {
	case e.Kind == application.EventRenewFailed || e.Kind == application.EventLost:
		level = slog.LevelWarn
	case e.Kind == application.EventReentered || e.Kind == application.EventRenewed || e.Kind == application.EventRefused,
		e.Kind == application.EventWaited && e.Took == 0: // it did not have to wait
		level = slog.LevelDebug
	}
	if !l.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	if e.Owner != "" {
		attrs = append(attrs, slog.String("owner", e.Owner))
	}
	if e.Resource.Type != "" {
		attrs = append(attrs, slog.String("resource", e.Resource.String()))
	}
	if e.Lock.Token != 0 {
		attrs = append(attrs, slog.Int64("token", e.Lock.Token), slog.Time("expires_at", e.Lock.ExpiresAt))
		if e.Lock.Note != "" {
			attrs = append(attrs, slog.String("note", e.Lock.Note))
		}
	}
	if p := e.Previous; p != nil {
		prefix := "previous_"
		switch e.Kind {
		case application.EventRefused:
			prefix = "holder_"
		case application.EventReleased:
			prefix = "" // the acquisition released: its token
		}
		attrs = append(attrs, slog.String(prefix+"owner", p.Owner), slog.Int64(prefix+"token", p.Token),
			slog.Time(prefix+"expires_at", p.ExpiresAt))
		if p.Note != "" {
			attrs = append(attrs, slog.String(prefix+"note", p.Note))
		}
	}
	if e.Kind == application.EventReleasedAll || e.Kind == application.EventCleanedUp {
		attrs = append(attrs, slog.Int("count", e.Count))
	}
	if e.Took > 0 {
		attrs = append(attrs, slog.Duration("took", e.Took))
	}
	if e.HeldFor > 0 {
		attrs = append(attrs, slog.Duration("held_for", e.HeldFor.Round(time.Millisecond)))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	l.log.LogAttrs(ctx, level, "lock "+e.Kind.String(), attrs...)
}

// Observers fans events out to several observers, in order.
type Observers []application.Observer

// Observe implements application.Observer.
func (o Observers) Observe(ctx context.Context, e application.Event) {
	for _, x := range o {
		x.Observe(ctx, e)
	}
}

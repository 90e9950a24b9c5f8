package domain

// StaleSnapshotError reports a fence check inside a caller's transaction
// that had read a snapshot before the check (a SQLite deferred
// transaction, a PostgreSQL one above READ COMMITTED), after which the
// lock changed. Nothing it guards may be written in that transaction, but
// the lock may still be held (Held): roll back and retry as Advice says.
//
// It unwraps to a *StoreError of kind StoreBusy, which a retry resolves,
// and never matches ErrExpired.
type StaleSnapshotError struct {
	Op string
	// What says what is true, in the database's terms.
	What string
	// Isolation is the transaction's isolation level as the database names
	// it ("REPEATABLE READ"), where it is known.
	Isolation string
	// Held is true when the lock was read outside the transaction, after
	// the check, and was held: only the transaction's snapshot is old.
	Held bool
	// Advice says what to do.
	Advice string
	// Err is the database's own report, if any.
	Err error
}

func (e *StaleSnapshotError) Error() string {
	msg := e.Op + ": " + e.What + "; " + e.Advice
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	return msg
}

// Unwrap returns the busy StoreError that e refines.
func (e *StaleSnapshotError) Unwrap() error {
	return &StoreError{Op: e.Op, Kind: StoreBusy, Err: e.Err, Advice: e.Advice}
}

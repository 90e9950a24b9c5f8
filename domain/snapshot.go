package domain

// StaleSnapshotError reports a check made inside a transaction of the
// caller's that could not see the database as it is now: the transaction
// read a snapshot before the check (a SQLite deferred transaction that
// read first; a PostgreSQL transaction at REPEATABLE READ or SERIALIZABLE
// that ran a statement before it), and the lock changed since. The check
// failed, and nothing it guards may be written in that transaction, but
// the lock itself may be held (Held says when it was read outside the
// transaction and found held): roll back and run the transaction again as
// Advice says.
//
// It is a busy store to every existing test of one: it unwraps to a
// *StoreError of kind StoreBusy (errors.Is(err, ErrUnavailable) and
// IsStoreKind(err, StoreBusy) hold), which a retry resolves. It never
// matches ErrExpired.
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

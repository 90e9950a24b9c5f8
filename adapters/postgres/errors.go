package postgres

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cleveragents/locks/domain"
)

// FormatError translates an error of the driver or of Ent into a
// *domain.StoreError naming what failed and what to do. It is the only
// place where PostgreSQL's errors are interpreted. Errors of the context
// and the domain's own errors pass through unchanged, and no password
// reaches the message.
func FormatError(op string, err error) error {
	if err == nil {
		return nil
	}
	// A connection that could not be made is the server's failure, even
	// when the driver says "context deadline exceeded": its connect_timeout
	// is a deadline of its own, not the caller's (entstore.Explain tells
	// the caller's apart, before this).
	if connErr := (*pgconn.ConnectError)(nil); errors.As(err, &connErr) {
		return storeError(op, domain.StoreUnreachable, redacted{err})
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if sessionSwapped(err) && !errors.Is(err, ErrTransactionPooling) {
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Advice: poolingAdvice,
			Err: fmt.Errorf("a statement that the store prepared on its server session was gone, or one it had not prepared was there: %w: %w",
				ErrTransactionPooling, redacted{err})}
	}
	if se, ok := err.(*domain.StoreError); ok && se.Advice == "" && serverAdvice[se.Kind] != "" {
		// Made by the shared store, with the domain's advice for a file.
		return storeError(se.Op, se.Kind, se.Err)
	}
	var se *domain.StoreError
	if errors.As(err, &se) || errors.Is(err, domain.ErrConflict) || errors.Is(err, domain.ErrExpired) ||
		errors.Is(err, domain.ErrValidation) || errors.Is(err, domain.ErrNotFound) {
		return err
	}
	return storeError(op, kindOf(err), redacted{err})
}

// storeError is a StoreError with the advice for a server.
func storeError(op string, kind domain.StoreErrorKind, err error) *domain.StoreError {
	return &domain.StoreError{Op: op, Kind: kind, Err: err, Advice: serverAdvice[kind]}
}

// serverAdvice says what to do about a failure of a database server,
// where the domain's default advice speaks of a file.
var serverAdvice = map[domain.StoreErrorKind]string{
	domain.StoreUnreachable: "check the host, port, database name, user and password of the URL, " +
		"and that the server is running and accepts connections from this host",
	domain.StoreReadOnly: "connect to the primary server as a user that may write the locks table, " +
		"with transactions that are not read-only by default (default_transaction_read_only)",
	domain.StoreCorrupt: "the server reported an internal error or damaged data: see its log",
	domain.StoreFull:    "free disk space on the database server",
	domain.StoreBusy:    "retry later, and look for long transactions or too many connections on the server",
}

// Advice returns what to do about a store error of kind on a PostgreSQL
// server, or "" where the domain's default advice holds.
func Advice(kind domain.StoreErrorKind) string { return serverAdvice[kind] }

func kindOf(err error) domain.StoreErrorKind {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == "25006": // read_only_sql_transaction: a standby, or default_transaction_read_only
			return domain.StoreReadOnly
		case code == "42501": // insufficient_privilege
			return domain.StoreReadOnly
		case code == "53100": // disk_full
			return domain.StoreFull
		case code == "42P01" || code == "42703": // undefined table or column
			return domain.StoreSchema
		case code == "55P03" || code == "57014" || code == "40001" || code == "40P01" || code == "53300":
			// lock timeout, cancelled by timeout, retries exhausted, too many connections
			return domain.StoreBusy
		case strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P") || code == "3D000" || code == "28P01" || code == "28000":
			return domain.StoreUnreachable // connection, shutdown, unknown database, authentication
		case strings.HasPrefix(code, "XX"):
			return domain.StoreCorrupt
		}
		return domain.StoreInternal
	}
	var netErr net.Error
	var connErr *pgconn.ConnectError
	if errors.As(err, &netErr) || errors.As(err, &connErr) || connectionLost(err) {
		return domain.StoreUnreachable
	}
	return domain.StoreInternal
}

// connectionLost reports an error of a connection that went away without
// a word from the server: a server stopped in immediate mode or killed, a
// backend that crashed, a peer that closed the socket. The driver then
// reports an end of file, or that the connection is closed (to the
// statements that follow on it in the same call), rather than a network
// error or a SQLSTATE.
func connectionLost(err error) bool {
	return errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, driver.ErrBadConn)
}

// sessionSwapped reports the mark of a pooler that lends server sessions
// per transaction, which the pooler probe (sharedSessions) may miss (a
// pool that hands its sessions out in turn can give a client the same one
// twice running): the server says that a statement pgx prepared on the
// connection's session does not exist there (invalid_sql_statement_name),
// or that one it is preparing already does (duplicate_prepared_statement).
// The store never deallocates a statement, and pgx names them by their
// text, so on a session of its own neither happens: the connection was
// given another client's session, or its own went to another client.
func sessionSwapped(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05") &&
		strings.HasPrefix(pgErr.Message, "prepared statement ")
}

// retryable reports whether PostgreSQL aborted the transaction to resolve
// a conflict that running it again resolves, or whether the write met a
// connection that the driver knew to be bad before it sent anything
// (driver.ErrBadConn: pgx says so only when nothing was sent, such as on
// a connection that another caller's cancellation closed, and
// database/sql gives up after a few of them when the pool holds several).
// Either way nothing was written, and the write can run again.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") ||
		errors.Is(err, driver.ErrBadConn)
}

// unwritten reports whether a write that failed with err wrote nothing:
// the driver never sent it (a connection that could not be made, or that
// it knew to be bad), or the server cancelled it (query_canceled: a cancel
// reaches a statement while it runs or waits, never a commit under way,
// whose interrupts the server holds off), or ended its wait for a lock
// (lock_not_available: a statement's wait, never a commit's).
func unwritten(err error) bool {
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	return errors.As(err, &pgErr) && (pgErr.Code == "57014" || pgErr.Code == "55P03") || errors.As(err, &connErr) ||
		pgconn.SafeToRetry(err) || errors.Is(err, driver.ErrBadConn)
}

// lockNotAvailable reports PostgreSQL's refusal of a statement that
// waited for a lock longer than its lock_timeout (lock_not_available):
// the statement was aborted, and wrote nothing.
func lockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// SnapshotConflict reports whether err is PostgreSQL's refusal of a
// statement whose transaction's snapshot conflicts with a change committed
// since (serialization_failure): above READ COMMITTED, a locking read of
// a row changed after the snapshot fails so. The transaction is aborted;
// running it again resolves it.
func SnapshotConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

// redacted hides passwords in the text of the error it wraps.
type redacted struct{ err error }

func (r redacted) Error() string { return Redact(r.err.Error()) }
func (r redacted) Unwrap() error { return r.err }

var (
	keywordPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)`)
	// urlPassword is the password of a URL's user info as written: from
	// the first ':' after "://" to the last '@' before the path, so that
	// an unescaped '@' in the password does not leak its end.
	urlPassword = regexp.MustCompile(`(://[^:/@\s"']*:)[^/\s"']*@`)
)

// Redact hides the password of a PostgreSQL DSN, in URL or key=value form,
// and in any text that quotes one, however the password is escaped.
func Redact(s string) string {
	s = urlPassword.ReplaceAllString(s, "${1}xxxxx@")
	return keywordPassword.ReplaceAllString(s, "${1}xxxxx")
}

// everyMembers reports whether a batch's failure, err, is every member's:
// the connection or the server failed (a lost or refused connection,
// resources exhausted, an operator's cancel or shutdown, an internal
// error), or the batch was cancelled, as each member's own statement would
// have been. Any other failure (of a constraint, a value, a deadlock the
// server chose the batch for) is the batch's own: its members run their
// own statements, so that none is failed for another's sake.
func everyMembers(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "53", "57", "58", "XX":
			return true
		}
		return false
	}
	var se *domain.StoreError
	if errors.As(err, &se) {
		return false // the store's own reading of a row
	}
	return true // the network, the driver's connection, a cancelled context
}

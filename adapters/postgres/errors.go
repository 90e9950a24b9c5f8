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
// *domain.StoreError naming what failed and what to do, without passwords.
// Errors of the context and the domain's own pass through unchanged.
func FormatError(op string, err error) error {
	if err == nil {
		return nil
	}
	// A failed connect is the server's failure even as "context deadline
	// exceeded": connect_timeout is not the caller's deadline
	// (entstore.Explain tells the caller's apart, before this).
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
		// The shared store's, with the domain's advice for a file.
		return storeError(se.Op, se.Kind, se.Err)
	}
	var se *domain.StoreError
	if errors.As(err, &se) || errors.Is(err, domain.ErrConflict) || errors.Is(err, domain.ErrExpired) ||
		errors.Is(err, domain.ErrValidation) || errors.Is(err, domain.ErrNotFound) {
		return err
	}
	return storeError(op, kindOf(err), redacted{err})
}

func storeError(op string, kind domain.StoreErrorKind, err error) *domain.StoreError {
	return &domain.StoreError{Op: op, Kind: kind, Err: err, Advice: serverAdvice[kind]}
}

// serverAdvice replaces the domain's advice, which speaks of a file.
var serverAdvice = map[domain.StoreErrorKind]string{
	domain.StoreUnreachable: "check the host, port, database name, user and password of the URL, " +
		"and that the server is running and accepts connections from this host",
	domain.StoreReadOnly: "connect to the primary server as a user that may write the locks table, " +
		"with transactions that are not read-only by default (default_transaction_read_only)",
	domain.StoreCorrupt: "the server reported an internal error or damaged data: see its log",
	domain.StoreFull:    "free disk space on the database server",
	domain.StoreBusy:    "retry later, and look for long transactions or too many connections on the server",
}

// Advice returns what to do about a store error of kind on a server, or ""
// where the domain's default holds.
func Advice(kind domain.StoreErrorKind) string { return serverAdvice[kind] }

func kindOf(err error) domain.StoreErrorKind {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == "25006" || code == "42501": // read-only transaction (a standby, or the default), insufficient privilege
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

// connectionLost reports a connection that went away without a SQLSTATE
// (immediate shutdown, a crash, a closed socket).
func connectionLost(err error) bool {
	return errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, driver.ErrBadConn)
}

// sessionSwapped reports a per-transaction pooler that sharedSessions
// missed: a statement pgx prepared is gone, or one it prepares is there
// (the store never deallocates, and pgx names statements by their text).
func sessionSwapped(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05") &&
		strings.HasPrefix(pgErr.Message, "prepared statement ")
}

// retryable reports a write aborted by a serialization failure or deadlock,
// or given a connection known bad before anything was sent.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") ||
		errors.Is(err, driver.ErrBadConn)
}

// unwritten reports a write that wrote nothing: never sent, or cancelled
// (57014) or timed out waiting for a lock (55P03), which reach a statement
// but never a commit under way.
func unwritten(err error) bool {
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	return errors.As(err, &pgErr) && (pgErr.Code == "57014" || pgErr.Code == "55P03") || errors.As(err, &connErr) ||
		pgconn.SafeToRetry(err) || errors.Is(err, driver.ErrBadConn)
}

// lockNotAvailable reports a statement aborted by its lock_timeout.
func lockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// SnapshotConflict reports a serialization failure: above READ COMMITTED,
// a locking read of a row changed since the snapshot.
func SnapshotConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

type redacted struct{ err error }

func (r redacted) Error() string { return Redact(r.err.Error()) }
func (r redacted) Unwrap() error { return r.err }

var (
	keywordPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)`)
	// urlPassword runs to the last '@' before the path: an unescaped '@'
	// in the password does not leak its end.
	urlPassword = regexp.MustCompile(`(://[^:/@\s"']*:)[^/\s"']*@`)
)

// Redact hides the passwords of PostgreSQL DSNs in s, however escaped.
func Redact(s string) string {
	s = urlPassword.ReplaceAllString(s, "${1}xxxxx@")
	return keywordPassword.ReplaceAllString(s, "${1}xxxxx")
}

// everyMembers reports whether a batch's failure is every member's (of the
// connection, server or context); on any other, members run their own.
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

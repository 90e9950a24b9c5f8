package postgres

import (
	"context"
	"errors"
	"net"
	"net/url"
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
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var se *domain.StoreError
	if errors.As(err, &se) || errors.Is(err, domain.ErrConflict) || errors.Is(err, domain.ErrExpired) ||
		errors.Is(err, domain.ErrValidation) || errors.Is(err, domain.ErrNotFound) {
		return err
	}
	return &domain.StoreError{Op: op, Kind: kindOf(err), Err: redacted{err}}
}

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
	if errors.As(err, &netErr) || errors.As(err, &connErr) {
		return domain.StoreUnreachable
	}
	return domain.StoreInternal
}

// retryable reports whether PostgreSQL aborted the transaction to resolve
// a conflict that running it again resolves.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// redacted hides passwords in the text of the error it wraps.
type redacted struct{ err error }

func (r redacted) Error() string { return Redact(r.err.Error()) }
func (r redacted) Unwrap() error { return r.err }

var keywordPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// Redact hides the password of a PostgreSQL DSN, in URL or key=value form,
// and in any text that quotes one.
func Redact(s string) string {
	s = keywordPassword.ReplaceAllString(s, "${1}xxxxx")
	for _, field := range strings.Fields(s) {
		u, err := url.Parse(strings.Trim(field, `"'(),;`))
		if err != nil || u.User == nil {
			continue
		}
		if _, ok := u.User.Password(); ok {
			s = strings.ReplaceAll(s, u.User.String()+"@", u.User.Username()+":xxxxx@")
		}
	}
	return s
}

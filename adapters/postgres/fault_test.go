package postgres_test

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/domain"
)

// A connection that went away without a word from the server (a server
// stopped in immediate mode, a crashed backend) is unreachable, as a
// refused connection is: the caller retries once the server is back.
// tests/pgfault produces these errors on a real server.
func TestFormatError_ConnectionLost(t *testing.T) {
	for name, cause := range map[string]error{
		"conn closed":    fmt.Errorf("begin: %w", pgconn.ErrConnClosed),
		"unexpected EOF": fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF),
		"EOF":            io.EOF,
		"bad connection": driver.ErrBadConn,
	} {
		t.Run(name, func(t *testing.T) {
			err := postgres.FormatError("acquire lock on plan/a", cause)
			var se *domain.StoreError
			require.True(t, errors.As(err, &se), "%T: %v", err, err)
			require.Equal(t, domain.StoreUnreachable, se.Kind, "%v", err)
			require.ErrorIs(t, err, domain.ErrUnavailable)
			require.ErrorIs(t, err, cause)
		})
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/domain"
)

// What the CLI does differently when --db is a PostgreSQL URL: the lock
// commands run through locks.Open as they do on a file, but diagnostics
// inspects the server its own way. (The adapter's errors already give
// advice for a server rather than for a file.)

// checkPostgresURL refuses a PostgreSQL URL with an unescaped '@' in its
// user info, before anything connects: libpq and pgx end the user info at
// the first '@', so the rest of the password would be taken for the host
// and quoted, unredacted, in the connection error.
func checkPostgresURL(db string) error {
	_, rest, _ := strings.Cut(db, "://")
	authority, _, _ := strings.Cut(rest, "/")
	if strings.Count(authority, "@") > 1 {
		return usagef("--db: the PostgreSQL URL has more than one '@' before its path: " +
			"write an '@' of the user name or password as %%40")
	}
	return nil
}

// oneLine joins the lines of a message: pgx reports a failure to connect
// to each host of a multi-host URL on a line of its own, indented, and a
// failure is reported in one line.
func oneLine(msg string) string {
	msg = strings.ReplaceAll(msg, ":\n\t", ": ")
	msg = strings.ReplaceAll(msg, "\n\t", "; ")
	return strings.ReplaceAll(msg, "\n", " ")
}

// inspectPostgres opens the PostgreSQL database for diagnostics, through
// postgres.OpenReadOnly, whose connections cannot write, and asks the
// server whether the service could write there (postgres.CheckWritable).
// It applies no migration, runs no cleanup, and creates nothing: not even
// goose's version table, which postgres.Open would.
func (c *invocation) inspectPostgres(ctx context.Context, dsn string) (check, *inspection) {
	db, err := postgres.OpenReadOnly(ctx, dsn, postgres.Options{})
	if err != nil {
		return check{Name: "database", Status: statusFail, Detail: c.postgresOpenAdvice(ctx, dsn, err)}, nil
	}
	database := check{Name: "database", Status: statusOK, Detail: dsn + " accepts connections, and this user can write there"}
	if err := postgres.CheckWritable(ctx, dsn); err != nil {
		detail := err.Error()
		var se *domain.StoreError
		if errors.As(err, &se) && se.Kind == domain.StoreReadOnly && se.Err != nil {
			detail = dsn + " accepts connections, but the service could not write there: " + se.Err.Error()
		}
		database = check{Name: "database", Status: statusFail, Detail: detail}
	}
	in := postgresInspection(db)
	c.checkServerClock(ctx, db, in)
	return database, in
}

// maxClockOffset is how far this host's clock may be from the server's
// before the clock check warns. Decisions use the server's time anyway;
// a larger offset says the host's time service is broken.
const maxClockOffset = time.Second

// checkServerClock measures this host's clock against the server's, makes
// the other checks decide on the server's time, as the service does, and
// adds the clock check to in.
func (c *invocation) checkServerClock(ctx context.Context, db *postgres.DB, in *inspection) {
	if c.localTime {
		in.clockCheck = &check{Name: "clock", Status: statusOK, Detail: "not measured: the checks use this host's clock, as asked"}
		return
	}
	sc, err := postgres.NewServerClock(ctx, db, c.clock)
	if err != nil {
		in.clockCheck = &check{Name: "clock", Status: statusFail, Detail: "the server's clock could not be read: " + err.Error()}
		return
	}
	closeDB := in.close
	in.close = func() error { sc.Close(); return closeDB() }
	in.clock = sc
	offset, uncertainty, _ := sc.Offset()
	way := "ahead of"
	if offset > 0 {
		way = "behind" // the server is ahead: this host is behind it
	}
	detail := fmt.Sprintf("this host's clock is %s %s the server's (±%s); locks expire on the server's time",
		offset.Abs().Round(time.Microsecond), way, uncertainty.Round(time.Microsecond))
	if offset.Abs() > maxClockOffset {
		in.clockCheck = &check{Name: "clock", Status: statusWarn, Detail: detail + fmt.Sprintf(
			"; more than %s: check this host's time service (NTP)", maxClockOffset)}
		return
	}
	in.clockCheck = &check{Name: "clock", Status: statusOK, Detail: detail}
}

// postgresOpenAdvice says why the server did not let diagnostics in, and
// what to do: when the deadline (ctx's) ended the attempt, only what
// bears on that, not the advice for a refused connection (host, user,
// password), which it was not.
func (c *invocation) postgresOpenAdvice(ctx context.Context, dsn string, err error) string {
	var se *domain.StoreError
	if errors.Is(context.Cause(ctx), errDeadline) {
		d, _ := c.deadline()
		cause := err
		if errors.As(err, &se) && se.Err != nil {
			cause = se.Err
		}
		return fmt.Sprintf("no answer from %s within %s: %v; check that the server is up, reachable from this host and not overloaded, "+
			"or set a longer --deadline (or AGENTS_TIMEOUT)", dsn, d, cause)
	}
	if errors.As(err, &se) && se.Kind == domain.StoreUnreachable && se.Err != nil {
		return fmt.Sprintf("cannot connect to %s: %v; %s (diagnostics never creates a database or a schema)",
			dsn, se.Err, postgres.Advice(domain.StoreUnreachable))
	}
	return err.Error()
}

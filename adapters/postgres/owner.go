package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/cleveragents/locks/domain"
)

// ownerAppName names the claim's connection in pg_stat_activity.
const ownerAppName = "cleveragents-locks owner"

// ownerClaim is a store's claim of its owner id (Options.Owner): a
// session advisory lock, on a connection of its own that the store keeps
// while it is open. The server drops it when the session ends: at Close,
// or when the process dies and its connection with it, so a dead process
// leaves nothing to clean. Its two int4 keys, a space of its own beside
// the one-bigint keys of the resources and the migrations, are 64 bits of
// the SHA-256 of the schema and the id: two different ids, or one id in
// two schemas, meet once in 2^64 pairs. Advisory locks are per database.
type ownerClaim struct{ conn *pgx.Conn }

// ownerKeys are the claim's advisory lock keys for owner in schema.
func ownerKeys(schema, owner string) (int32, int32) {
	sum := sha256.Sum256([]byte(schema + "\x00" + owner))
	k1, k2 := int32(binary.BigEndian.Uint32(sum[:4])), int32(binary.BigEndian.Uint32(sum[4:8]))
	if k1 == watchClass {
		k1 ^= 1 // never a watch lock's
	}
	return k1, k2
}

// claimOwner claims owner in schema on a connection of cfg, or returns a
// *domain.OwnerInUseError when another open store claims it; nothing for
// an empty owner. database names the database in the error.
func claimOwner(ctx context.Context, op string, cfg *pgx.ConnConfig, schema, owner, database string) (*ownerClaim, error) {
	if owner == "" {
		return nil, nil
	}
	cfg = cfg.Copy()
	name := ownerAppName
	if app := cfg.RuntimeParams["application_name"]; app != "" {
		name = app + " (" + ownerAppName + ")"
	}
	cfg.RuntimeParams["application_name"] = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, FormatError(op, err)
	}
	// The claim's session only idles: a server or role that ends idle
	// sessions (PostgreSQL 14's idle_session_timeout) must not end it.
	if _, err := conn.Exec(ctx, "SELECT set_config('idle_session_timeout', '0', false) "+
		"WHERE current_setting('server_version_num')::int >= 140000"); err != nil {
		closeConn(conn)
		return nil, FormatError(op, err)
	}
	k1, k2 := ownerKeys(schema, owner)
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1::int4, $2::int4)", k1, k2).Scan(&got); err != nil {
		closeConn(conn)
		return nil, FormatError(op, err)
	}
	if !got {
		closeConn(conn)
		return nil, &domain.OwnerInUseError{Owner: owner, Database: database,
			Where: fmt.Sprintf("its claim in schema %q is the session advisory lock (%d, %d), held by a connection named %q while that container is open",
				schema, k1, k2, ownerAppName)}
	}
	return &ownerClaim{conn: conn}, nil
}

// close ends the claim's session, and with it the claim, within ctx.
func (c *ownerClaim) close(ctx context.Context) error {
	if c == nil {
		return nil
	}
	return c.conn.Close(ctx)
}

// closeConn closes conn within a bound of its own: the caller's context may be over.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
	defer cancel()
	_ = conn.Close(ctx)
}

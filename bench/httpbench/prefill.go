package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemhttp"
)

// prefillChunk is how many records one INSERT of prefill writes.
const prefillChunk = 500_000

// prefill fills idem's record table with n completed records before the
// run (-records), as a service holding a day or two of keys has it: one
// request through idem gives a stored record, copied n times under random
// UUIDv4 keys (UUIDv7 keys of their creation time if v7), created over the
// last 24 hours in time order (the heap and
// the expires_at index in that order, the primary key's entries spread
// over the whole key range), live for 48 hours after their creation. The
// table is then vacuumed and analyzed, as autovacuum would have, and a
// checkpoint taken, so that the run starts from clean pages.
func prefill(ctx context.Context, hc *http.Client, baseURL string, conn *pgx.Conn, schema string, n int, v7 bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+pathIdem, bytes.NewReader(paymentBody(0)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.KeyHeader, "httpbench-prefill-sample")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("prefill: sample request: %w", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("prefill: sample request answered %d", resp.StatusCode)
	}
	table := pgx.Identifier{schema, "idempotency_record"}.Sanitize()
	key := "gen_random_uuid()::text"
	if v7 {
		// The creation time's milliseconds, version 7, then random bits.
		key = `overlay(overlay(gen_random_uuid()::text placing
				substr(lpad(to_hex((extract(epoch FROM t.at) * 1000)::bigint), 12, '0'), 1, 8) || '-' ||
				substr(lpad(to_hex((extract(epoch FROM t.at) * 1000)::bigint), 12, '0'), 9, 4) from 1 for 13)
			placing '7' from 15 for 1)`
	}
	start := time.Now()
	for done := 0; done < n; done += prefillChunk {
		m := min(prefillChunk, n-done)
		// Record i of n was created (n-i)/n of 24 hours ago.
		_, err := conn.Exec(ctx, `INSERT INTO `+table+`
				(scope, idempotency_key, fingerprint, state, http_status, headers, body, created_at, expires_at)
			SELECT s.scope, `+key+`, s.fingerprint, 'completed', s.http_status, s.headers, s.body,
				t.at, t.at + interval '48 hours'
			FROM `+table+` s,
				LATERAL (SELECT now() - (($2::bigint - i)::float8 / $2) * interval '24 hours' AS at
					FROM generate_series($1::bigint, $1::bigint + $3 - 1) i) t
			WHERE s.idempotency_key = 'httpbench-prefill-sample'
			ORDER BY t.at`, done, n, m)
		if err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
		fmt.Printf("prefill: %d of %d records (%s)\n", done+m, n, time.Since(start).Round(time.Second))
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
		return fmt.Errorf("prefill: vacuum: %w", err)
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("prefill: checkpoint: %w", err)
	}
	var heap, pkey, total int64
	if err := conn.QueryRow(ctx, `SELECT pg_relation_size($1::regclass), pg_relation_size(i.indexrelid), pg_total_relation_size($1::regclass)
		FROM pg_index i WHERE i.indrelid = $1::regclass AND i.indisprimary`, table).Scan(&heap, &pkey, &total); err != nil {
		return fmt.Errorf("prefill: sizes: %w", err)
	}
	fmt.Printf("prefill: %d records in %s; table %d MiB, primary key %d MiB, with the other index %d MiB\n\n",
		n, time.Since(start).Round(time.Second), heap>>20, pkey>>20, total>>20)
	return nil
}

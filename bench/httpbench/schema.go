package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// createSchema creates the bench's schema with the business table and the
// naive interceptor's record table. idem's own tables are created by
// pgdriver's Migrate.
func createSchema(ctx context.Context, conn *pgx.Conn, schema string) error {
	s := pgx.Identifier{schema}.Sanitize()
	stmts := []string{
		"CREATE SCHEMA " + s,
		// The business effect. No UNIQUE on idem_key on purpose: the
		// duplicates experiment counts how many times each key executed.
		`CREATE TABLE ` + s + `.payment (
			id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			idem_key    text          NOT NULL,
			customer_id bigint        NOT NULL,
			amount      numeric(19,4) NOT NULL,
			currency    text          NOT NULL,
			created_at  timestamptz   NOT NULL DEFAULT now())`,
		// A naive interceptor's idempotency_record: a global key, the
		// body hash, the stored response.
		`CREATE TABLE ` + s + `.naive_idempotency_record (
			idempotency_key text        PRIMARY KEY,
			command_hash    text        NOT NULL,
			response        bytea,
			http_status     integer     NOT NULL,
			created_at      timestamptz NOT NULL DEFAULT now())`,
	}
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
	}
	return nil
}

// createFloorTable creates scenario z's record table: idem's
// idempotency_record (created by Migrate before), its columns, constraints
// and indexes.
func createFloorTable(ctx context.Context, conn *pgx.Conn, schema string) error {
	s := pgx.Identifier{schema}.Sanitize()
	_, err := conn.Exec(ctx, `CREATE TABLE `+s+`.floor_record (LIKE `+s+`.idempotency_record INCLUDING ALL)`)
	if err != nil {
		return fmt.Errorf("create floor_record: %w", err)
	}
	return nil
}

// dropSchema drops the bench's schema and everything in it.
func dropSchema(ctx context.Context, conn *pgx.Conn, schema string) error {
	_, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	return err
}

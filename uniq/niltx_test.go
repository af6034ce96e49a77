package uniq_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/uniq"
)

// noPanic runs fn and turns a panic into an error.
func noPanic(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return fn()
}

// The Tx helpers given a nil transaction (an idemhttp.TxFromContext that
// found none, not checked) refuse it with an error that says so, and run
// neither create nor get. They used to panic with a nil pointer
// dereference.
func TestNilTxRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := uniq.Constraint{Name: "payment_provider_external_id_key"}
	called := false
	pgFn := func(context.Context, pgx.Tx) (int, error) { called = true; return 1, nil }
	sqlFn := func(context.Context, *sql.Tx) (int, error) { called = true; return 1, nil }
	for _, tt := range []struct {
		what string
		fn   func() error
	}{
		{"CreateOrGetTx", func() error { _, _, err := uniq.CreateOrGetTx(ctx, nil, c, pgFn, pgFn); return err }},
		{"CreateOrGetSQLTx", func() error { _, _, err := uniq.CreateOrGetSQLTx(ctx, nil, c, sqlFn, sqlFn); return err }},
		{"SavepointTx", func() error {
			return uniq.SavepointTx(ctx, nil, func(pgx.Tx) error { called = true; return nil })
		}},
		{"SavepointSQLTx", func() error {
			return uniq.SavepointSQLTx(ctx, nil, func(*sql.Tx) error { called = true; return nil })
		}},
	} {
		err := noPanic(tt.fn)
		if err == nil || strings.HasPrefix(err.Error(), "panic:") || !strings.Contains(err.Error(), "nil transaction") {
			t.Errorf("%s with a nil transaction: %v; want an error saying the transaction is nil", tt.what, err)
		}
	}
	if called {
		t.Error("a function ran without a transaction")
	}
}

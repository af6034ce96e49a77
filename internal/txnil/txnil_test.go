package txnil_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/txnil"
)

type structTx struct{ _ int }

func TestIs(t *testing.T) {
	var pgxNil pgx.Tx
	var sqlNil *sql.Tx
	if !txnil.Is(pgxNil) || !txnil.Is(sqlNil) || !txnil.Is[any](nil) {
		t.Error("a nil pgx.Tx, *sql.Tx or interface is not nil")
	}
	if txnil.Is(&sql.Tx{}) || txnil.Is(structTx{}) {
		t.Error("a transaction that is not nil is nil")
	}
	tx := &sql.Tx{}
	if n := testing.AllocsPerRun(100, func() { _ = txnil.Is(tx) }); n != 0 {
		t.Errorf("Is allocates %v times; want 0", n)
	}
	var ptx pgx.Tx
	if n := testing.AllocsPerRun(100, func() { _ = txnil.Is(ptx) }); n != 0 {
		t.Errorf("Is of a pgx.Tx allocates %v times; want 0", n)
	}
}

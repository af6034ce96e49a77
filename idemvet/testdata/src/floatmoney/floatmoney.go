package floatmoney

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5/pgxpool"
)

type Money float64

type Order struct {
	ID         int64    `json:"id"`
	Amount     float64  `json:"amount"`     // want "money held as float"
	UnitPrice  float32  `json:"unit_price"` // want "money held as float"
	TotalEUR   Money    `json:"total_eur"`  // want "money held as float"
	Fee        *float64 `db:"fee"`          // want "money held as float"
	Amt        float64  `json:"amt"`        // want "money held as float"
	X          float64  `json:"balance"`    // want "money held as float"
	SubTotal   float64  `json:"subTotal"`   // want "money held as float"
	TaxPercent float64  `json:"tax_percent"`
}

type Metrics struct {
	TotalSeconds float64 `json:"total_seconds"`
	SumSq        float64 `json:"sum_sq"`
	Consumer     float64 `json:"consumer"`
	Checksum     float64 `json:"checksum"`
	PriceRatio   float64 `json:"price_ratio"`
	Amount       float64 `json:"-"`
	Cost         float64 // untagged: not reported
	Total        int64   `json:"total"`
}

func insert(ctx context.Context, pool *pgxpool.Pool, db *sql.DB, o Order) {
	price := 9.99
	total := float64(o.ID) * price
	pool.Exec(ctx, "INSERT INTO lines (price, total) VALUES ($1, $2)", price, total) // want "money held as float" "money held as float"
	db.ExecContext(ctx, "UPDATE orders SET amount = $1", o.Amount)                   // want "money held as float"
	pool.QueryRow(ctx, "SELECT id FROM orders WHERE total > $1", o.SubTotal)         // want "money held as float"

	// Not reported.
	ratio := 0.5
	cents := int64(999)
	pool.Exec(ctx, "UPDATE orders SET ratio = $1, amount_cents = $2", ratio, cents)
	pool.Exec(ctx, "UPDATE orders SET amount = $1", int64(o.Amount*100))
}

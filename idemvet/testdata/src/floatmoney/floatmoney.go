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

// A sum or total beside statistics of the same measurements (a min, a max,
// a mean, buckets, a quantile) is an aggregate of measurements, not money:
// a histogram or gauge snapshot exported as JSON.

type histogramPoint struct {
	Count          uint64    `json:"count"`
	Sum            *float64  `json:"sum,omitempty"`
	BucketCounts   []uint64  `json:"bucketCounts"`
	ExplicitBounds []float64 `json:"explicitBounds"`
	Min            *float64  `json:"min,omitempty"`
	Max            *float64  `json:"max,omitempty"`
}

type GaugeValue struct {
	Max   float64 `json:"max"`
	Min   float64 `json:"min"`
	Sum   float64 `json:"sum"`
	Last  float64 `json:"last"`
	Count uint64  `json:"count"`
}

type LatencySummary struct {
	Total float64 `json:"total"`
	Avg   float64 `json:"avg"`
	P99   float64 `json:"p99"`
}

// Still money: no statistic beside the sum (a count is not one), a money
// word other than sum or total, or statistics of money (MinPrice).

type Withdrawal struct {
	Order string  `json:"order"`
	Sum   float64 `json:"sum"` // want "money held as float"
}

type Cart struct {
	Count int     `json:"count"`
	Total float64 `json:"total"` // want "money held as float"
}

type FeeSchedule struct {
	Fee float64 `json:"fee"` // want "money held as float"
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

// A limit is not a statistic: MaxItems, MinQuantity.
type LimitedCart struct {
	MaxItems    int     `json:"max_items"`
	MinQuantity int     `json:"min_quantity"`
	Total       float64 `json:"total"` // want "money held as float"
}

type PriceRange struct {
	MinPrice float64 `json:"min_price"` // want "money held as float"
	MaxPrice float64 `json:"max_price"` // want "money held as float"
	Total    float64 `json:"total"`     // want "money held as float"
}

// PostgreSQL's EXPLAIN (FORMAT JSON) keys: the planner's cost estimate of a
// plan node, read to keep a query within a budget, is not money.

type explainPlan struct {
	Plan planNode `json:"Plan"`
}

type planNode struct {
	NodeType    string     `json:"Node Type"`
	StartupCost float64    `json:"Startup Cost"`
	TotalCost   float64    `json:"Total Cost"`
	PlanRows    float64    `json:"Plan Rows"`
	Plans       []planNode `json:"Plans"`
}

// Still money: the same Go name under another tag (an API's usage cost).

type usage struct {
	TotalCost float64 `json:"total_cost"` // want "money held as float"
}

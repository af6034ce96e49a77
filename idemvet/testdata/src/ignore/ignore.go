// Package ignore checks //idemvet:ignore comments: each silences the
// rules it names on its own line, or on the next line when it stands
// alone, and only with a reason.
package ignore

import (
	"net/http"

	"github.com/idemkit/idem/idemhttp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type Server struct {
	pool *pgxpool.Pool
}

type Line struct {
	Price float64 `json:"price"` //idemvet:ignore idemfloatmoney the upstream API sends a float; converted to cents on read
	//idemvet:ignore idemfloatmoney shown to the user, never summed
	Total float64 `json:"total"`
	Fee   float64 `json:"fee"` //idemvet:ignore idemtxwrite wrong rule named // want "money held as float"
	//idemvet:ignore idemtxwrite wrong rule named
	Cost float64 `json:"cost"` // want "money held as float"
	//idemvet:ignore idemfloatmoney
	Sum float64 `json:"sum"` // want "money held as float"
	//idemvet:ignore idemfloatmoney,idemtxwrite
	Tip float64 `json:"tip_amount"` // want "money held as float"
	//idemvet:ignore idemfloatmoney,idemtxwrite
	Due     float64 `json:"due_amount"`   // want "money held as float"
	Net     float64 `json:"net_amount"`   // idemvet:ignore idemfloatmoney a space after the slashes: not a directive // want "money held as float"
	Due2    float64 `json:"due2_amount"`  /* idemvet:ignore idemfloatmoney not a line comment */ // want "money held as float"
	Gross   float64 `json:"gross_amount"` //idemvet:ignore idemfloatmoney a trailing comment applies to its own line only
	Balance float64 `json:"balance"`      // want "money held as float"
}

func (s *Server) Handler(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	var l Line
	tx.Exec(ctx, "INSERT INTO lines VALUES (1)")
	// Two rules report this line; one comment names both.
	s.pool.Exec(ctx, "UPDATE audit SET price = $1", l.Price) //idemvet:ignore idemtxwrite,idemfloatmoney the audit row must survive a rollback; the price is the upstream float
	//idemvet:ignore idemfloatmoney,idemtxwrite the audit row must survive a rollback; the price is the upstream float
	s.pool.Exec(ctx, "UPDATE audit SET total = $1", l.Total)
	// Naming one of the two silences that one only.
	s.pool.Exec(ctx, "UPDATE audit SET fee = $1", l.Fee) //idemvet:ignore idemtxwrite the audit row must survive a rollback // want "money held as float"
	//idemvet:ignore idemfloatmoney the price is the upstream float
	s.pool.Exec(ctx, "UPDATE audit SET cost = $1", l.Cost) // want "write through the pool bypasses"
	// The line above the comment is not silenced.
	s.pool.Exec(ctx, "UPDATE audit SET n = 1") // want "write through the pool bypasses"
	//idemvet:ignore idemtxwrite the audit row must survive a rollback

	// Only the line just above: a blank line in between ends it.
	s.pool.Exec(ctx, "UPDATE audit SET n = 2") // want "write through the pool bypasses"
	//idemvet:ignore idemtxwrite
	s.pool.Exec(ctx, "UPDATE audit SET n = 3") // want "write through the pool bypasses"
	//idemvet:ignoreidemtxwrite the audit row must survive a rollback
	s.pool.Exec(ctx, "UPDATE audit SET n = 4") // want "write through the pool bypasses"
	s.pool.Exec(ctx, "UPDATE audit SET n = 5") //idemvet:ignore idemtxwrite the audit row must survive a rollback
	s.pool.Exec(ctx, "UPDATE audit SET n = 6") // want "write through the pool bypasses"
	/*
		//idemvet:ignore idemtxwrite inside a block comment
	*/
	s.pool.Exec(ctx, "UPDATE audit SET n = 7")                            // want "write through the pool bypasses"
	if _, err := s.pool.Exec(ctx, "UPDATE audit SET n = 8"); err != nil { //idemvet:ignore idemtxwrite the audit row must survive a rollback
		s.pool.Exec(ctx, "UPDATE audit SET n = 9") // want "write through the pool bypasses"
	}
}

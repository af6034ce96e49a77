package payments

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// TimeFormat is how created_at is written: RFC 3339, UTC, microseconds.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// paymentJSON is the JSON form of a Payment (see the package documentation).
type paymentJSON struct {
	ID         string `json:"id"`
	Provider   string `json:"provider"`
	ExternalID string `json:"external_payment_id"`
	Amount     string `json:"amount"`
	Status     string `json:"status"`
	CustomerID int64  `json:"customer_id"`
	CreatedAt  string `json:"created_at"`
}

func toJSON(p Payment) paymentJSON {
	return paymentJSON{
		ID:         strconv.FormatInt(p.ID, 10),
		Provider:   p.Provider,
		ExternalID: p.ExternalID,
		Amount:     p.Amount.StringFixed(AmountScale),
		Status:     p.Status,
		CustomerID: p.CustomerID,
		CreatedAt:  p.CreatedAt.UTC().Format(TimeFormat),
	}
}

// Location is the URL of the payment with id.
func Location(id int64) string { return "/v1/payments/" + strconv.FormatInt(id, 10) }

// writePayment answers with p as JSON.
func writePayment(w http.ResponseWriter, status int, p Payment) {
	b, err := json.Marshal(toJSON(p))
	if err != nil { // cannot happen: only strings and an int64
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// FormatTime formats t as created_at is written.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }

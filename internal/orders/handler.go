package orders

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/apijson"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/problem"
)

// Handler serves the orders endpoints. Create must run behind idemhttp in
// ModeTx: it writes the order and its event through the middleware's
// transaction.
type Handler[TTx any] struct {
	store      Store[TTx]
	drv        driver.Driver[TTx]
	projection bool
	log        *slog.Logger
}

// NewHandler returns the handler. drv is the driver whose outbox receives
// the events; projection says whether the projection runs (when it does
// not, Summary answers 503). log may be nil.
func NewHandler[TTx any](store Store[TTx], drv driver.Driver[TTx], projection bool, log *slog.Logger) *Handler[TTx] {
	if log == nil {
		log = slog.Default()
	}
	return &Handler[TTx]{store: store, drv: drv, projection: projection, log: log}
}

// Create is POST /v1/orders: the order and its OrderCreated.v1 event in
// the middleware's transaction, then 201 with the order.
func (h *Handler[TTx]) Create(w http.ResponseWriter, r *http.Request) {
	if apijson.Refuse(w, r, "order") { // as apijson.RequireJSON, in front of the middleware
		return
	}
	no, err := DecodeCreate(r.Body)
	if err != nil {
		if cause := errors.Unwrap(err); cause != nil && r.Context().Err() == nil {
			h.log.InfoContext(r.Context(), "orders: request body unreadable", "method", r.Method, "path", r.URL.Path, "err", cause)
		}
		apijson.WriteRequestError(w, err, "Invalid order")
		return
	}
	ctx := r.Context()
	tx, ok := idemhttp.TxFromContext[TTx](ctx)
	if !ok {
		h.internalError(w, r, errors.New("no transaction in the request context: Create must run behind idemhttp in ModeTx"))
		return
	}
	o, err := h.store.Create(ctx, tx, no)
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	e, err := CreatedEvent(o)
	if err == nil {
		err = outbox.EnqueueTx(ctx, h.drv, tx, e)
	}
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	w.Header().Set("Location", Location(o.ID))
	writeJSON(w, http.StatusCreated, toJSON(o))
}

var idRe = regexp.MustCompile(`^[1-9][0-9]{0,18}$`)

func parseID(raw string) (int64, bool) {
	id, err := strconv.ParseInt(raw, 10, 64)
	return id, idRe.MatchString(raw) && err == nil
}

// Get is GET /v1/orders/{id}.
func (h *Handler[TTx]) Get(w http.ResponseWriter, r *http.Request) {
	raw := r.PathValue("id")
	id, ok := parseID(raw)
	if !ok {
		notFound(w, "Order not found", "There is no order with id "+strconv.Quote(raw)+".")
		return
	}
	o, err := h.store.Get(r.Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		notFound(w, "Order not found", "There is no order with id "+strconv.Quote(raw)+".")
	case err != nil:
		h.internalError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, toJSON(o))
	}
}

// Summary is GET /v1/customers/{id}/summary: the projection's row (orders,
// pending, confirmed, rejected, total_amount of the confirmed orders,
// last_order_id), 404 before the customer's first event reached it, 503
// when the projection does not run.
func (h *Handler[TTx]) Summary(w http.ResponseWriter, r *http.Request) {
	if !h.projection {
		problem.WriteError(w, http.StatusServiceUnavailable, "", "Projection off",
			"The order projection is off (idemd runs with -kafka off): orders are stored and their events stay in the outbox.")
		return
	}
	raw := r.PathValue("id")
	const title = "Summary not found"
	detail := "Customer " + strconv.Quote(raw) + " has no order in the projection (yet: it is eventually consistent)."
	id, ok := parseID(raw)
	if !ok {
		notFound(w, title, detail)
		return
	}
	s, err := h.store.Summary(r.Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		notFound(w, title, detail)
	case err != nil:
		h.internalError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, summaryJSON{
			CustomerID:  s.CustomerID,
			Orders:      s.Orders,
			Pending:     s.Pending(),
			Confirmed:   s.Confirmed,
			Rejected:    s.Rejected,
			TotalAmount: s.TotalAmount.StringFixed(AmountScale),
			LastOrderID: strconv.FormatInt(s.LastOrderID, 10),
		})
	}
}

type orderJSON struct {
	ID         string `json:"id"`
	CustomerID int64  `json:"customer_id"`
	Amount     string `json:"amount"`
	Status     string `json:"status"`
	Items      []Item `json:"items"`
	CreatedAt  string `json:"created_at"`
	// PaymentID is set once the order saga charged the order.
	PaymentID string `json:"payment_id,omitempty"`
}

// summaryJSON is a customer's summary: orders created, of which pending
// (orders - confirmed - rejected, never below 0), confirmed and rejected;
// total_amount sums the confirmed orders only.
type summaryJSON struct {
	CustomerID  int64  `json:"customer_id"`
	Orders      int64  `json:"orders"`
	Pending     int64  `json:"pending"`
	Confirmed   int64  `json:"confirmed"`
	Rejected    int64  `json:"rejected"`
	TotalAmount string `json:"total_amount"`
	LastOrderID string `json:"last_order_id"`
}

func toJSON(o Order) orderJSON {
	j := orderJSON{
		ID:         strconv.FormatInt(o.ID, 10),
		CustomerID: o.CustomerID,
		Amount:     o.Amount.StringFixed(AmountScale),
		Status:     o.Status,
		Items:      o.Items,
		CreatedAt:  FormatTime(o.CreatedAt),
	}
	if o.PaymentID != 0 {
		j.PaymentID = strconv.FormatInt(o.PaymentID, 10)
	}
	return j
}

// Location is the path of an order.
func Location(id int64) string { return "/v1/orders/" + strconv.FormatInt(id, 10) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // cannot happen: strings, integers and items
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func notFound(w http.ResponseWriter, title, detail string) {
	problem.WriteError(w, http.StatusNotFound, "", title, detail)
}

// internalError answers 500, or 503 store-unavailable when the database
// failed for a while (apijson.Unavailable: a connection lost) or the
// request's context ended (its deadline passed while it waited); the idemhttp
// middleware stores neither and rolls the transaction back, so a retry
// executes again.
func (h *Handler[TTx]) internalError(w http.ResponseWriter, r *http.Request, err error) {
	if apijson.Unavailable(err) || r.Context().Err() != nil {
		// The connection was lost or the database failed for a while,
		// or did not answer within the request's deadline (a pool
		// whose connections are all taken, a lock held long):
		// the middleware rolls the transaction back and stores no 5xx.
		if r.Context().Err() == nil {
			h.log.WarnContext(r.Context(), "orders: database unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		apijson.WriteUnavailable(w, r, "order")
		return
	}
	if r.Context().Err() == nil {
		h.log.ErrorContext(r.Context(), "orders: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	problem.WriteError(w, http.StatusInternalServerError, "", "Internal error",
		"The order was not processed. Retry with the same Idempotency-Key.")
}

package payments

import (
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/apijson"
	"github.com/idemkit/idem/problem"
)

// Handler serves the payment endpoints. Create must run behind an idemhttp
// middleware in ModeTx for the same database: it writes in the
// middleware's transaction (idemhttp.TxFromContext[TTx]) and never commits
// it.
type Handler[TTx any] struct {
	store Store[TTx]
	log   *slog.Logger
}

// NewHandler returns the handlers on store. log defaults to slog.Default().
func NewHandler[TTx any](store Store[TTx], log *slog.Logger) *Handler[TTx] {
	if log == nil {
		log = slog.Default()
	}
	return &Handler[TTx]{store: store, log: log}
}

// Create serves POST /v1/payments: 201 with Location for a new payment, 200
// with the existing payment when its provider and external id are known,
// 400/413/415/422 problems for bad requests.
func (h *Handler[TTx]) Create(w http.ResponseWriter, r *http.Request) {
	if apijson.Refuse(w, r, "payment") { // as apijson.RequireJSON, in front of the middleware
		return
	}
	np, err := DecodeCreate(r.Body)
	if err != nil {
		if cause := errors.Unwrap(err); cause != nil && r.Context().Err() == nil {
			h.log.InfoContext(r.Context(), "payments: request body unreadable", "method", r.Method, "path", r.URL.Path, "err", cause)
		}
		apijson.WriteRequestError(w, err, "Invalid payment")
		return
	}
	ctx := r.Context()
	tx, ok := idemhttp.TxFromContext[TTx](ctx)
	if !ok {
		h.internalError(w, r, errors.New("no transaction in the request context: Create must run behind idemhttp in ModeTx"))
		return
	}
	p, created, err := h.store.CreateOrGet(ctx, tx, np)
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	if !created && !p.Same(np) {
		// The same business identity with other details: not this
		// request's payment. A 200 would tell a client that checks the
		// status that its payment exists.
		problem.Write(w, problem.Problem{Type: problem.TypeConflict, Status: http.StatusConflict,
			Title: "Payment exists with other details",
			Detail: "A payment with this provider and external_payment_id already exists with another amount or customer_id. " +
				"Nothing was created. Do not retry: read the existing payment at " + Location(p.ID) + ".",
			Extensions: map[string]any{"payment": Location(p.ID)}})
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", Location(p.ID))
	}
	writePayment(w, status, p)
}

// idRe accepts the canonical spelling of a positive id only, so that each
// payment has one URL.
var idRe = regexp.MustCompile(`^[1-9][0-9]{0,18}$`)

// Get serves GET /v1/payments/{id}: 200 or 404.
func (h *Handler[TTx]) Get(w http.ResponseWriter, r *http.Request) {
	raw := r.PathValue("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if !idRe.MatchString(raw) || err != nil {
		notFound(w, raw)
		return
	}
	p, err := h.store.Get(r.Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		notFound(w, raw)
	case err != nil:
		h.internalError(w, r, err)
	default:
		writePayment(w, http.StatusOK, p)
	}
}

func notFound(w http.ResponseWriter, id string) {
	problem.WriteError(w, http.StatusNotFound, "", "Payment not found", "There is no payment with id "+strconv.Quote(id)+".")
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
			h.log.WarnContext(r.Context(), "payments: database unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		apijson.WriteUnavailable(w, r, "payment")
		return
	}
	if r.Context().Err() == nil {
		h.log.ErrorContext(r.Context(), "payments: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	problem.WriteError(w, http.StatusInternalServerError, "", "Internal error",
		"The payment was not processed. Retry with the same Idempotency-Key.")
}

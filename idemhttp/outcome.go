package idemhttp

// Outcome says what the middleware did with a protected request.
type Outcome int

const (
	// OutcomeExecuted: the handler ran and its response was stored.
	OutcomeExecuted Outcome = iota
	// OutcomeReplayed: a stored response was replayed; the handler did not run.
	OutcomeReplayed
	// OutcomeNotStored: the handler ran but its outcome was not stored (5xx,
	// panic, cancelled request, response too large): rolled back or released.
	OutcomeNotStored
	// OutcomeMismatch: the key was reused with another request (409/422).
	OutcomeMismatch
	// OutcomeInProgress: a concurrent request holds the key (409 Retry-After).
	OutcomeInProgress
	// OutcomeRejected: the request was refused before claiming (bad or
	// missing key, body too large, unauthenticated).
	OutcomeRejected
	// OutcomeStoreError: the store failed (503), the commit's result is
	// unknown, or the request's deadline passed before the key was
	// claimed (503; the handler did not run).
	OutcomeStoreError
	// OutcomeAbandoned: the client went away (the request's context was
	// cancelled) while the key was being claimed or waited for: the
	// handler did not run and nothing was stored. The request is
	// answered 503 store-unavailable all the same, in case the client is
	// still there (a server whose BaseContext ended). A request whose
	// deadline passed instead counts as OutcomeStoreError.
	OutcomeAbandoned
)

func (o Outcome) String() string {
	switch o {
	case OutcomeExecuted:
		return "executed"
	case OutcomeReplayed:
		return "replayed"
	case OutcomeNotStored:
		return "not_stored"
	case OutcomeMismatch:
		return "mismatch"
	case OutcomeInProgress:
		return "in_progress"
	case OutcomeRejected:
		return "rejected"
	case OutcomeStoreError:
		return "store_error"
	case OutcomeAbandoned:
		return "abandoned"
	}
	return "unknown"
}

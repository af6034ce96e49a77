// Package problem writes RFC 9457 problem details
// (application/problem+json) for idem's own errors and for applications
// that want the same error format.
//
// A problem is a small JSON object:
//
//	{"type":"https://github.com/idemkit/idem/blob/main/docs/problems.md#key-reused",
//	 "title":"Idempotency-Key already used for another request","status":409,
//	 "detail":"This key was used on this endpoint with a different request target (path and query) or body. Use a new key for a new operation."}
//
// The Type constants name idem's problem types; each one is documented, with
// what a client should do about it, in docs/problems.md at the anchor of the
// same name.
package problem

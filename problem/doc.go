// Package problem writes RFC 9457 problem details
// (application/problem+json) for idem's own errors and for applications
// that want the same error format.
//
// A problem is a small JSON object:
//
//	{"type":"https://github.com/idemkit/idem/blob/main/docs/problems.md#key-reused",
//	 "title":"Idempotency-Key reused","status":409,
//	 "detail":"the key was first used with a different request"}
//
// The Type constants name idem's problem types; each one is documented, with
// what a client should do about it, in docs/problems.md at the anchor of the
// same name.
package problem

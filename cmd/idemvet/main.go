// Command idemvet checks Go packages against idem's idempotency rules; see
// package github.com/idemkit/idem/idemvet and docs/idemvet.md.
//
//	idemvet ./...
//	go vet -vettool=$(which idemvet) ./...
package main

import (
	"golang.org/x/tools/go/analysis/multichecker"

	"github.com/idemkit/idem/idemvet"
)

func main() {
	multichecker.Main(idemvet.Analyzers()...)
}

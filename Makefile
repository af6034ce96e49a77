# idem developer tasks. `make test` is the README's test command.
GOLANGCI_LINT_VERSION := v2.15.0

.PHONY: run test bench lint fmt fuzz tools

run:
	go run ./cmd/idemd

# The modules of go.work: the core, idemotel and cmd/idemd.
MODULES := ./... ./idemotel/... ./cmd/idemd/...

test:
	go test -race -count=1 -parallel 4 -timeout 14m $(MODULES)

bench:
	go run ./bench/httpbench

fmt:
	gofmt -w $$(git ls-files '*.go')

lint: tools
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	go vet $(MODULES)
	go run ./cmd/idemvet $(MODULES)
	go mod tidy -diff
	cd idemotel && go mod tidy -diff
	cd cmd/idemd && go mod tidy -diff
	$$(go env GOPATH)/bin/golangci-lint run ./...
	cd idemotel && $$(go env GOPATH)/bin/golangci-lint run ./...
	cd cmd/idemd && $$(go env GOPATH)/bin/golangci-lint run ./...

# Short fuzzing sessions of the parsers; the seed corpus also runs in `make test`.
# -fuzz is a regular expression that must match exactly one target, hence the
# anchors (FuzzCanonicalJSON alone also matches FuzzCanonicalJSONGolden).
fuzz:
	go test ./idemhttp -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime 30s
	go test ./idemhttp -run '^$$' -fuzz '^FuzzCanonicalJSON$$' -fuzztime 30s

tools:
	test -x $$(go env GOPATH)/bin/golangci-lint || go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

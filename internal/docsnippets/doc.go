// Package docsnippets has no code of its own: its test type-checks the Go
// snippets of the documentation (the ```go blocks of README.md, docs/*.md
// and docs/design/*.md, and the Go code blocks of the library's package
// documentation) against the module's current API, so that a renamed
// function, a removed field or a changed signature fails a test instead of
// a newcomer's first build.
//
// A ```go block must be Go: elisions ("{ ... }", "f(x, ...)", a line of
// "...") are allowed, and a fragment of statements is checked as a
// function's body. The variables a snippet takes as given (ctx, drv, tx,
// ...) are declared in the test's preludes; a snippet that needs another
// one is still checked, without the uses of that name (the test logs it).
// Use ```text for what is not Go.
package docsnippets

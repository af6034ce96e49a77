package idemhttp

import (
	"strings"
	"testing"
)

// Scopes of distinct (principal, method, route) never meet, whatever
// spaces a custom principal or a ServeMux pattern holds; a principal
// without spaces or percent signs is stored as it is.
func TestScopeOfUnambiguous(t *testing.T) {
	t.Parallel()
	type parts struct{ principal, method, route string }
	cases := []parts{
		{"a POST", "POST", "/x"},
		{"a", "POST", "POST /x"},
		{"a%20POST", "POST", "/x"},
		{"a", "POST", "/x"},
		{"a POST POST", "POST", "/x"},
	}
	seen := map[string]parts{}
	for _, c := range cases {
		s := scopeOf(c.principal, c.method, c.route)
		if prev, ok := seen[s]; ok {
			t.Fatalf("%+v and %+v share the scope %q", prev, c, s)
		}
		seen[s] = c
	}
	if s := "auth:0123abcd POST /v1/é"; storedScope(s) != s {
		t.Fatalf("storedScope(%q) = %q, want it unchanged", s, storedScope(s))
	}
	for _, s := range []string{"p POST /f/\xff", "p POST /f/\x00", "p POST /" + strings.Repeat("a", maxScopeBytes)} {
		if got := storedScope(s); len(got) != 66 || !strings.HasPrefix(got, "h:") || got == storedScope(s+"x") {
			t.Fatalf("storedScope(%.20q) = %q, want h: and a distinct hash", s, got)
		}
	}
	if got := scopeOf("auth:0123abcd", "POST", "POST /v1/payments"); got != "auth:0123abcd POST POST /v1/payments" {
		t.Fatalf("plain principal stored as %q", got)
	}
}

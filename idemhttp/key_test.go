package idemhttp

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

// quoteKey returns key as an RFC 8941 sf-string.
func quoteKey(key string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}

func keyHeaders(values ...string) http.Header {
	h := http.Header{}
	for _, v := range values {
		h.Add(KeyHeader, v)
	}
	return h
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	longest := strings.Repeat("k", MaxKeyLen)
	tests := []struct {
		name    string
		h       http.Header
		want    string
		wantErr error
	}{
		{"uuid", keyHeaders("0190d6b2-7c3e-7f0a-9d1e-3c4b5a697887"), "0190d6b2-7c3e-7f0a-9d1e-3c4b5a697887", nil},
		{"single char", keyHeaders("a"), "a", nil},
		{"longest length", keyHeaders(longest), longest, nil},
		{"all visible ASCII but quote", keyHeaders("!#$%&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~"), "!#$%&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~", nil},
		{"surrounding spaces and tabs trimmed", keyHeaders(" \t abc\t "), "abc", nil},
		{"quoted", keyHeaders(`"abc"`), "abc", nil},
		{"quoted with spaces around", keyHeaders(`  "abc"	`), "abc", nil},
		{"quoted escapes", keyHeaders(`"a\"b\\c"`), `a"b\c`, nil},
		{"quoted longest length", keyHeaders(`"` + longest + `"`), longest, nil},
		{"quoted longest length with escapes", keyHeaders(`"` + strings.Repeat(`\"`, MaxKeyLen) + `"`), strings.Repeat(`"`, MaxKeyLen), nil},
		{"header name case-insensitive", http.Header{"Idempotency-Key": {"x"}}, "x", nil},

		{"absent", http.Header{}, "", ErrKeyMissing},
		{"absent with other headers", http.Header{"Idempotency-Keys": {"x"}}, "", ErrKeyMissing},
		{"empty slice", http.Header{KeyHeader: {}}, "", ErrKeyMissing},
		{"twice", keyHeaders("a", "b"), "", ErrKeyMultiple},
		{"twice identical", keyHeaders("a", "a"), "", ErrKeyMultiple},
		{"twice empty", keyHeaders("", ""), "", ErrKeyMultiple},

		{"empty", keyHeaders(""), "", ErrKeyMalformed},
		{"only spaces", keyHeaders("  \t "), "", ErrKeyMalformed},
		{"empty quoted", keyHeaders(`""`), "", ErrKeyMalformed},
		{"too long", keyHeaders(longest + "k"), "", ErrKeyMalformed},
		{"quoted too long", keyHeaders(`"` + longest + `k"`), "", ErrKeyMalformed},
		{"inner space", keyHeaders("a b"), "", ErrKeyMalformed},
		{"quoted inner space", keyHeaders(`"a b"`), "", ErrKeyMalformed},
		{"quoted only space", keyHeaders(`" "`), "", ErrKeyMalformed},
		{"inner tab", keyHeaders("a\tb"), "", ErrKeyMalformed},
		{"control char", keyHeaders("a\x01b"), "", ErrKeyMalformed},
		{"DEL", keyHeaders("a\x7fb"), "", ErrKeyMalformed},
		{"newline", keyHeaders("a\nb"), "", ErrKeyMalformed},
		{"NUL", keyHeaders("a\x00"), "", ErrKeyMalformed},
		{"non-ASCII", keyHeaders("clé"), "", ErrKeyMalformed},
		{"quoted non-ASCII", keyHeaders(`"clé"`), "", ErrKeyMalformed},
		{"quoted control", keyHeaders("\"a\x01\""), "", ErrKeyMalformed},
		{"combined by a proxy", keyHeaders("a, b"), "", ErrKeyMalformed},
		{"combined quoted", keyHeaders(`"a", "b"`), "", ErrKeyMalformed},
		{"unterminated quote", keyHeaders(`"abc`), "", ErrKeyMalformed},
		{"lone quote", keyHeaders(`"`), "", ErrKeyMalformed},
		{"trailing quote only", keyHeaders(`abc"`), "", ErrKeyMalformed},
		{"inner quote", keyHeaders(`a"b`), "", ErrKeyMalformed},
		{"data after closing quote", keyHeaders(`"abc"d`), "", ErrKeyMalformed},
		{"two quoted strings", keyHeaders(`"a""b"`), "", ErrKeyMalformed},
		{"escaped closing quote", keyHeaders(`"abc\"`), "", ErrKeyMalformed},
		{"backslash at end", keyHeaders(`"abc\`), "", ErrKeyMalformed},
		{"bad escape", keyHeaders(`"a\nb"`), "", ErrKeyMalformed},
		{"sf parameters", keyHeaders(`"abc";p=1`), "", ErrKeyMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseKey(tt.h)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ParseKey = %q, %v; want error %v", got, err, tt.wantErr)
				}
				if got != "" {
					t.Errorf("key = %q with error, want empty", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseKey = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestParseKeyErrorHidesValue checks that error messages do not echo client
// input (log injection, leaking keys into logs).
func TestParseKeyErrorHidesValue(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"secret value", `"secret`, "secret\n", `secret"x`} {
		_, err := ParseKey(keyHeaders(v))
		if err == nil {
			t.Fatalf("ParseKey(%q) succeeded", v)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("error %q echoes the header value", err)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"abc", `"abc"`, `"a\"b\\c"`, " abc ", "", `""`, `"`, `\`, `"\`, `"a\x"`,
		"a b", "clé", strings.Repeat("x", MaxKeyLen), strings.Repeat("x", MaxKeyLen+1),
		`"` + strings.Repeat(`\\`, MaxKeyLen) + `"`, "a\x00", `"a" `, `a"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := ParseKey(keyHeaders(v))
		if err != nil {
			if !errors.Is(err, ErrKeyMalformed) {
				t.Fatalf("ParseKey(%q) error %v is not ErrKeyMalformed", v, err)
			}
			if key != "" {
				t.Fatalf("ParseKey(%q) = %q with error", v, key)
			}
			return
		}
		if len(key) < 1 || len(key) > MaxKeyLen {
			t.Fatalf("ParseKey(%q) = %q: length %d", v, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %d not visible ASCII", v, key, i)
			}
		}
		// The quoted form of a key always names the same key.
		if again, err := ParseKey(keyHeaders(quoteKey(key))); err != nil || again != key {
			t.Fatalf("quoted %q parsed as %q, %v", key, again, err)
		}
		// So does the bare form, for keys it can spell.
		if !strings.Contains(key, `"`) {
			if again, err := ParseKey(keyHeaders(key)); err != nil || again != key {
				t.Fatalf("bare %q parsed as %q, %v", key, again, err)
			}
		}
		// Parsing is idempotent on the header value itself.
		if again, err := ParseKey(keyHeaders(v)); err != nil || again != key {
			t.Fatalf("second parse of %q gave %q, %v", v, again, err)
		}
	})
}

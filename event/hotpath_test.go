package event

import (
	"regexp"
	"testing"
)

// typeRE is TypePattern as a regexp: validType must agree with it.
var typeRE = regexp.MustCompile(TypePattern)

var typeCases = []string{
	"", "a", "v1", ".v1", "a.v", "a.v1", "A.v12", "a.v1x", "a.V1", "a..v1", "a-.v1", "a_b-c.d.v0",
	"OrderCreated.v1", "payments.Refunded.v12", "1a.v1", "_a.v1", "-a.v1", "a.v1.v2", "a.v1\n",
	"a b.v1", "a/b.v1", "é.v1", "aé.v1", "a\x00.v1", "a\xff.v1", "a.v१", "a.v1 ", " a.v1",
	"a.v99999999999999999999", "a..v", "av1", "a.vv1", "Z9.v9", "z.v0", "a:b.v1",
}

func TestValidTypeMatchesTypePattern(t *testing.T) {
	for _, s := range typeCases {
		if got, want := validType(s), typeRE.MatchString(s); got != want {
			t.Errorf("validType(%q) = %v, TypePattern says %v", s, got, want)
		}
	}
}

func FuzzValidType(f *testing.F) {
	for _, s := range typeCases {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validType(s), typeRE.MatchString(s); got != want {
			t.Errorf("validType(%q) = %v, TypePattern says %v", s, got, want)
		}
	})
}

// BenchmarkValidType is the type check that Validate and FromRecord run
// per event, against the regexp it replaces.
func BenchmarkValidType(b *testing.B) {
	const typ = "payments.PaymentCaptured.v12"
	b.Run("validType", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !validType(typ) {
				b.Fatal("rejected")
			}
		}
	})
	b.Run("regexp", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !typeRE.MatchString(typ) {
				b.Fatal("rejected")
			}
		}
	})
}

var timeCases = []string{
	"", "2026-12-04T14:00:00Z", "2026-12-04T14:00:00.123456Z", "2026-12-04T14:00:00.123456789+02:00",
	"2026-12-04t14:00:00z", "2026-12-04 14:00:00Z", "2026-12-04T14:00:00", "2026-12-04T24:00:00Z",
	"2026-02-30T14:00:00Z", "0000-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "2026-12-04T14:00:00,5Z",
	"2026-12-04T14:00:00.Z", "2026-12-04T14:00:00+24:00", "2026-12-04T14:00:00+23:60", "2026-12-04T14:00:00.1234567891Z",
	"+2026-12-04T14:00:00Z", "2026-12-04T14:00:00Z ", "2026-1-04T14:00:00Z", "2026-12-04T14:00:60Z",
}

// TestParseTimeBytesMatchesParseTime: the allocation-free path must accept
// exactly what parseTime accepts, with the same instant.
func TestParseTimeBytesMatchesParseTime(t *testing.T) {
	for _, s := range timeCases {
		checkParseTimeBytes(t, s)
	}
}

func FuzzParseTimeBytes(f *testing.F) {
	for _, s := range timeCases {
		f.Add(s)
	}
	f.Fuzz(checkParseTimeBytes)
}

func checkParseTimeBytes(t *testing.T, s string) {
	got, gotErr := parseTimeBytes([]byte(s))
	want, wantErr := parseTime(s)
	if (gotErr == nil) != (wantErr == nil) || !got.Equal(want) || got.Location() != want.Location() {
		t.Errorf("parseTimeBytes(%q) = %v, %v; parseTime = %v, %v", s, got, gotErr, want, wantErr)
	}
	if gotErr != nil && gotErr.Error() != wantErr.Error() {
		t.Errorf("parseTimeBytes(%q) error %q, parseTime %q", s, gotErr, wantErr)
	}
}

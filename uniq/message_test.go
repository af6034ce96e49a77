package uniq_test

import (
	"testing"

	"github.com/idemkit/idem/uniq"
)

// codedErr mimics modernc.org/sqlite's *Error.
type codedErr struct {
	msg  string
	code int
}

func (e *codedErr) Error() string { return e.msg }
func (e *codedErr) Code() int     { return e.code }

func TestIsSQLiteMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		msg  string
		code int
		want bool
	}{
		{"constraint failed: UNIQUE constraint failed: payment.provider, payment.external_id (2067)", 2067, true},
		{"UNIQUE constraint failed: payment.provider, payment.external_id", 2067, true},
		{"constraint failed: UNIQUE constraint failed: Payment.Provider, PAYMENT.external_id (2067)", 2067, true},
		{"constraint failed: UNIQUE constraint failed: index 'payment_provider_external_id_key' (2067)", 2067, true},
		{"constraint failed: UNIQUE constraint failed: index 'other_key' (2067)", 2067, false},
		{"constraint failed: UNIQUE constraint failed: payment.provider, payment.external_id, payment.x (2067)", 2067, false},
		{"constraint failed: UNIQUE constraint failed: payment.provider (2067)", 2067, false},
		{"constraint failed: UNIQUE constraint failed: refund.provider, refund.external_id (2067)", 2067, false},
		{"constraint failed: UNIQUE constraint failed: payment.provider, payment.external_id (2067)", 19, false},
		{"constraint failed: NOT NULL constraint failed: payment.provider (1299)", 1299, false},
		{"constraint failed: UNIQUE constraint failed: payment.provider, payment.external_id (1555)", 1555, true},
	}
	for _, tt := range tests {
		if got := uniq.Is(&codedErr{tt.msg, tt.code}, pairKey); got != tt.want {
			t.Errorf("Is(%q, code %d) = %v, want %v", tt.msg, tt.code, got, tt.want)
		}
	}
}

package problem

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzRoundTrip checks that a problem document a client decodes survives
// being passed on: whatever UnmarshalJSON accepts, MarshalJSON encodes as
// valid JSON that decodes to the same Problem and encodes to the same bytes.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"type":"t","title":"T","status":409,"detail":"d","instance":"/i","balance":12345678901234567890,"tags":["a"]}`,
		`{"type":1,"title":null,"status":"409","detail":["x"],"instance":{}}`, `{"status":409.5}`, `{"status":42}`,
		`{"Status":200,"TYPE":"x"}`, `[]`, `null`, `"x"`, `{`, `{} {}`, `{"type":"a","type":"b"}`,
		`{"n":1.50,"x":{"y":[1e400,-0,"\u003c\ud83d\ude00"]},"":null}`, "{\"k\":\"\xff\"}", `{"status":4.09e2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var p Problem
		if err := json.Unmarshal(in, &p); err != nil {
			return
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("%q decodes to %#v, which does not encode: %v", in, p, err)
		}
		if !json.Valid(b) {
			t.Fatalf("%#v encodes to invalid JSON %q", p, b)
		}
		var q Problem
		if err := json.Unmarshal(b, &q); err != nil {
			t.Fatalf("%q (from %q) does not decode: %v", b, in, err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip of %q through %q:\n got  %#v\n want %#v", in, b, q, p)
		}
		b2, err := json.Marshal(q)
		if err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("%#v encodes to %q, then %q (%v)", p, b, b2, err)
		}
	})
}

package leaseowner

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

func TestNew(t *testing.T) {
	t.Parallel()
	a, b := New(), New()
	if a == b {
		t.Errorf("two owners are both %q; want them unique", a)
	}
	host, _ := os.Hostname()
	re := regexp.MustCompile("^" + regexp.QuoteMeta(host) + "/" + strconv.Itoa(os.Getpid()) + "/[0-9a-f]{12}$")
	if !re.MatchString(a) {
		t.Errorf("owner %q; want host/pid/12 hex digits", a)
	}
}

package idemkafka_test

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// TestMain runs twice as many of this package's parallel tests at once as
// -parallel asks for. Most of them wait on a broker's or kgo's timeouts
// (seconds each, the process mostly idle: 95 s of CPU in 155 s of a run
// at -parallel 4 on 2 cores), so the package, the suite's longest, was
// bound by its parallel slots, not by the machine: at -parallel 8 it takes
// about 110 s instead of 160.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.parallel"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err == nil && n > 0 {
			_ = f.Value.Set(strconv.Itoa(2 * n))
		}
	}
	os.Exit(m.Run())
}

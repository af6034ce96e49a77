package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestListenIsOutsideTheEphemeralRangeAndCanBeListenedOnAgain(t *testing.T) {
	low := ephemeralLow()
	for range 20 {
		ln, err := Listen()
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if low > lowest+1000 && (port < lowest || port >= low) {
			t.Errorf("port %d: not in [%d, %d)", port, lowest, low)
		}
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		again, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen again on %s: %v", addr, err)
		}
		_ = again.Close()
	}
}

func TestAddrIsFree(t *testing.T) {
	addr, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("%s is not free: %v", addr, err)
	}
	_ = ln.Close()
}

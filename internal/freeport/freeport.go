// Package freeport hands tests loopback ports that a process can bind again
// after a restart.
//
// A port taken from a listener on port 0 and closed is in the kernel's
// ephemeral range, the range it also gives to outgoing connections. Between
// the close and a restarted server's bind, any client connection of the
// machine may take it, and the server fails with "address already in use".
// The ports handed out here lie below that range, where the kernel puts
// nothing by itself; each is checked free when it is chosen.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// lowest is the lowest port handed out, above the usual services' ports.
const lowest = 10000

// Addr returns a 127.0.0.1 address whose port was free a moment ago and is
// outside the kernel's ephemeral range.
func Addr() (string, error) {
	ln, err := Listen()
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", err
	}
	return addr, nil
}

// Port is Addr's port.
func Port() (int, error) {
	addr, err := Addr()
	if err != nil {
		return 0, err
	}
	_, p, _ := net.SplitHostPort(addr)
	return strconv.Atoi(p)
}

// Listen listens on a 127.0.0.1 port outside the kernel's ephemeral range,
// so that the same address can be listened on again after a Close. Where
// that range cannot be read, it listens on port 0.
func Listen() (net.Listener, error) {
	hi := ephemeralLow()
	if hi <= lowest+1000 {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	var last error
	for range 200 {
		port := lowest + rand.IntN(hi-lowest)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EACCES) {
			return nil, err
		}
		last = err
	}
	return nil, fmt.Errorf("freeport: no free port in [%d, %d): %w", lowest, hi, last)
}

// ephemeralLow is the first port of Linux's ephemeral range, or 0 where it
// cannot be read. Other systems' ranges start at 49152 or above; a port
// below 32768 is outside them as well.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		if os.IsNotExist(err) {
			return 32768
		}
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return n
}

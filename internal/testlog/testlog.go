// Package testlog holds what tests share to capture logs and output.
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use: a logger, a child
// process's output or a client library may write to it from several
// goroutines while the test reads it. The zero value is ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

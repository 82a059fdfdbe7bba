package sshx

import "sync"

// TailBuffer keeps only the last Max bytes written: command output is
// unbounded, memory for it must not be.
type TailBuffer struct {
	Max       int
	mu        sync.Mutex
	buf       []byte
	truncated bool
}

func (t *TailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.Max {
		t.buf = append(t.buf[:0], p[len(p)-t.Max:]...)
		t.truncated = true
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.Max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.truncated = true
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the kept tail.
func (t *TailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// Truncated reports whether earlier output was dropped.
func (t *TailBuffer) Truncated() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.truncated
}

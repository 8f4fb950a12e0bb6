//go:build unix

package breaker

import "syscall"

// peeks says that waiting can tell.
const peeks = true

// waiting reports whether bytes wait to be read on conn, without reading
// them or blocking, and without waiting for a read of another goroutine's
// in progress on it (Control takes no lock of the reads').
func waiting(conn syscall.Conn) bool {
	raw, err := conn.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}

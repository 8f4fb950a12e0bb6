//go:build !unix

package breaker

import "syscall"

// peeks says that waiting cannot tell: a connection's silence is not
// known, and a call is judged by what the node's connections read and
// wrote alone (see Node.unresponsive).
const peeks = false

// waiting reports whether bytes wait to be read on conn: on this platform
// the cache cannot tell, and says no (a call whose reply came but was read
// too late is then judged by the writes and reads alone).
func waiting(syscall.Conn) bool { return false }

// Package breaker judges the Redis calls of a packcache.Cache, node by
// node: each call's time budget, whether a call that failed says the node
// failed or only that this process was too busy to make it in time, and
// a circuit breaker per node that stops calls from waiting on a node that
// keeps failing.
//
// The files follow a call: [Nodes] finds a key's [Node] (nodes.go); the
// call takes one of the node's slots ([Node.Enter]) and a [Budget]
// (budget.go); once made, [Judge] says what its error means (judge.go),
// and [Node.Feed] tells the breaker (breaker.go). What a node's
// connections saw, which Judge reads, is reported by the connections
// themselves (conn.go).
//
// The rules callers can rely on:
//
//   - a caller's own context ending is never the node's failure;
//   - a refused connection opens the node's breaker at once and ends the
//     node's calls under way, whatever goroutine of go-redis's dialled;
//   - a call that ran out of its budget is the node's failure if, within
//     the call's time, a command written to the node went unanswered for
//     at least half the budget: on the call's own connection or on another
//     of the node's (one the pool's callers wait for), whatever the node's
//     other connections answered meanwhile; unanswered meaning that
//     nothing came back on that connection and nothing waits unread on its
//     socket. Where the sockets cannot be looked into, or the node has
//     connections the cache does not watch, it is also the node's failure
//     if nothing came back from the node since the call began while a
//     command written to it waited at least half the budget. Otherwise
//     (the reply was there and only its reader was late, or the command
//     was written too late to wait that long, or never) it is [Late]: this
//     process was too busy. So a node that pauses writes, stops, or hangs
//     fails each call to it in one budget, and a busy process fails none;
//     [Judge] states the rule, [Node] keeps it (unresponsive);
//   - after Config.Failures consecutive failures the breaker opens for
//     Config.Cooldown, then lets one call through to probe: its success
//     closes the breaker, its failure opens it again.
package breaker

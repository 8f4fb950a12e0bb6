package packcache

// Serializers the tests use that the package does not export: an
// application writes its own in a few lines.
var (
	StdJSON Serializer = jsonSerializer{}
	Gob     Serializer = gobSerializer{}
)

// HoldGates keeps every update of c's near-cache gates waiting until
// release is called: it stands for a machine too loaded to run, in time,
// whatever would close them. c must have a near cache.
func HoldGates[T any](c *Cache[T]) (release func()) {
	return c.core.tracker.HoldGates()
}

// SlotWaiters returns how many of c's calls wait for a connection to a
// node (see breaker.enter), over every node.
func SlotWaiters[T any](c *Cache[T]) int64 {
	return c.core.nodes.Waiting()
}

// LoadsUnderWay is the number of c's loads and refreshes under way (by
// key and the state each began from), for tests that must know a load
// has ended, not only that its value is stored.
func LoadsUnderWay[T any](c *Cache[T]) int {
	return c.core.loads.Len()
}

package packcache

// SettleNear runs the maintenance c's near caches owe now (evictions past
// MaxBytes, which otter otherwise runs on a goroutine of its own), so that
// what they hold afterwards is within their bounds.
func SettleNear[T any](c *Cache[T]) {
	for _, n := range c.core.nears {
		n.entries.CleanUp()
	}
}

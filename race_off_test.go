//go:build !race

package packcache_test

const raceEnabled = false

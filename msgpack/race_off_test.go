//go:build !race

package msgpack_test

const raceEnabled = false

//go:build race

package brotli_test

const raceEnabled = true

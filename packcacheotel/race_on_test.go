//go:build race

package packcacheotel_test

const raceEnabled = true

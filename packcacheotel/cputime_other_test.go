//go:build !unix

package packcacheotel_test

import "time"

func cpuTime() (time.Duration, bool) { return 0, false }

package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// bytesIEC formats a byte count for people: "812 B", "4.0 KiB", "9.04 MiB".
func bytesIEC(n float64) string {
	const unit = 1024
	if math.Abs(n) < unit {
		return fmt.Sprintf("%.0f B", n)
	}
	for i, suffix := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v := n / math.Pow(unit, float64(i+1))
		if math.Abs(v) < unit || suffix == "TiB" {
			switch {
			case math.Abs(v) < 10:
				return fmt.Sprintf("%.2f %s", v, suffix)
			case math.Abs(v) < 100:
				return fmt.Sprintf("%.1f %s", v, suffix)
			}
			return fmt.Sprintf("%.0f %s", v, suffix)
		}
	}
	return ""
}

// count formats an integer with thousands separators: 100,000.
func count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// counted formats n with its noun, plural unless n is 1: "1 key", "2,000 keys".
func counted(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return count(n) + " " + noun + "s"
}

// ttlString formats a remaining TTL in milliseconds, as PTTL gives it.
func ttlString(ms int64) string {
	switch {
	case ms == -1:
		return "no expiry"
	case ms < 0:
		return "key gone"
	case ms < 1000:
		return fmt.Sprintf("%dms", ms)
	}
	return (time.Duration(ms) * time.Millisecond).Round(time.Second).String()
}

// percentile returns the p-th percentile (0-100) of sorted xs, nearest rank.
func percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// sortedCopy returns xs sorted, leaving xs as it was.
func sortedCopy(xs []int64) []int64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s
}

// share formats part/whole as a percentage.
func share(part, whole float64) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*part/whole)
}

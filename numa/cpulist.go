package numa

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// maxCPUID bounds CPU numbers in a CPU list, so that a malformed list such
// as "0-4000000000" is an error rather than a huge allocation. Linux's
// NR_CPUS is at most 8192.
const maxCPUID = 1 << 16

// ParseCPUList parses the kernel's CPU list format ("0-3,8,10-11", as in
// sysfs cpulist files and libvirt cpusets) into sorted, distinct CPU
// numbers. Surrounding white space (the newline of a sysfs file) is
// ignored; an empty list is an empty slice. Errors wrap
// errdefs.ErrInvalidArgument.
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return []int{}, nil
	}
	var cpus []int
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := parseCPU(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %w", s, err)
		}
		last := first
		if isRange {
			if last, err = parseCPU(hi); err != nil {
				return nil, fmt.Errorf("cpu list %q: %w", s, err)
			}
			if last < first {
				return nil, fmt.Errorf("cpu list %q: range %q runs backwards: %w", s, part, errdefs.ErrInvalidArgument)
			}
		}
		for c := first; c <= last; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

func parseCPU(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 || n >= maxCPUID {
		return 0, fmt.Errorf("%q is not a CPU number from 0 to %d: %w", s, maxCPUID-1, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

// FormatCPUList formats CPU numbers in the kernel's CPU list format, with
// runs of consecutive numbers as ranges: [0 1 2 3 8 10 11] is "0-3,8,10-11".
// The input need not be sorted; duplicates are dropped. Empty input is "".
func FormatCPUList(cpus []int) string {
	if len(cpus) == 0 {
		return ""
	}
	sorted := slices.Clone(cpus)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	var b strings.Builder
	for i := 0; i < len(sorted); {
		j := i
		for j+1 < len(sorted) && sorted[j+1] == sorted[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(sorted[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(sorted[j]))
		}
		i = j + 1
	}
	return b.String()
}

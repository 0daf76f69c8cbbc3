package numa

import (
	"encoding/json"
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

// CPUList is a list of host CPU numbers that reads and writes JSON in the
// kernel's CPU list format ("0-3,8"), so that a placement on a large node
// stays short in the state file and in domain metadata. It also accepts a
// JSON array of numbers. Its String is the same format, which is also
// libvirt's cpuset syntax.
type CPUList []int

func (l CPUList) String() string { return FormatCPUList(l) }

// MarshalJSON writes the list as a JSON string.
func (l CPUList) MarshalJSON() ([]byte, error) {
	return strconv.AppendQuote(nil, FormatCPUList(l)), nil
}

// UnmarshalJSON reads a CPU list string or an array of numbers.
func (l *CPUList) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '[' {
		var cpus []int
		if err := json.Unmarshal(b, &cpus); err != nil {
			return err
		}
		*l = cpus
		return nil
	}
	s, err := strconv.Unquote(string(b))
	if err != nil {
		return fmt.Errorf("cpu list %s is not a JSON string: %w", b, errdefs.ErrInvalidArgument)
	}
	cpus, err := ParseCPUList(s)
	if err != nil {
		return err
	}
	if len(cpus) == 0 {
		cpus = nil
	}
	*l = cpus
	return nil
}

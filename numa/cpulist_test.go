package numa

import (
	"slices"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"", []int{}},
		{"\n", []int{}},
		{"0", []int{0}},
		{"0-3\n", []int{0, 1, 2, 3}},
		{"0-3,8,10-11", []int{0, 1, 2, 3, 8, 10, 11}},
		{"10-11, 8 ,0-1", []int{0, 1, 8, 10, 11}},
		{"2,2,1-3", []int{1, 2, 3}},
		{"5-5", []int{5}},
	} {
		got, err := ParseCPUList(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"a", "1-", "-1", "3-1", "1,,2", "1-2-3", "0-99999999", "1:2"} {
		if got, err := ParseCPUList(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want an invalid argument error", bad, got, err)
		}
	}
}

func TestFormatCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
	}{
		{nil, ""},
		{[]int{0}, "0"},
		{[]int{0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"},
		{[]int{11, 10, 8, 3, 2, 1, 0, 8}, "0-3,8,10-11"},
		{[]int{1, 3, 5}, "1,3,5"},
		{[]int{4, 5}, "4-5"},
	} {
		if got := FormatCPUList(tc.in); got != tc.want {
			t.Errorf("FormatCPUList(%v) = %q, want %q", tc.in, got, tc.want)
		}
		back, err := ParseCPUList(tc.want)
		if err != nil || FormatCPUList(back) != tc.want {
			t.Errorf("round trip of %q gave %v, %v", tc.want, back, err)
		}
	}
}

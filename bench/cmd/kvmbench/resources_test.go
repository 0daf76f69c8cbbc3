package main

import (
	"strings"
	"testing"
)

// A QEMU smaps excerpt: its binary, a 1 GiB TCG code buffer (anonymous,
// larger than the guest), the 512 MiB guest RAM with 2 MiB of alignment,
// and a heap.
const qemuSmaps = `55d0c0000000-55d0c0800000 r-xp 00000000 fe:01 1234 /usr/bin/qemu-system-x86_64
Size:               8192 kB
Rss:                6000 kB
Pss:                3000 kB
VmFlags: rd ex mr mw me dw
7f0000000000-7f0040000000 rwxp 00000000 00:00 0
Size:            1048576 kB
Rss:               20000 kB
Pss:               20000 kB
7f1000000000-7f1020200000 rw-p 00000000 00:00 0
Size:             526336 kB
Rss:              500000 kB
Pss:              500000 kB
THPeligible:    1
7f2000000000-7f2000400000 rw-p 00000000 00:00 0 [heap]
Size:               4096 kB
Rss:                4000 kB
Pss:                4000 kB
`

func TestParseSmaps(t *testing.T) {
	rss, pss, guest, err := parseSmaps(strings.NewReader(qemuSmaps), 512)
	if err != nil {
		t.Fatal(err)
	}
	if rss != 530000 || pss != 527000 || guest != 500000 {
		t.Errorf("rss %d pss %d guest %d; want 530000, 527000, 500000", rss, pss, guest)
	}
	if _, _, _, err := parseSmaps(strings.NewReader(qemuSmaps), 2048); err == nil {
		t.Error("found a 2 GiB guest RAM mapping in a 512 MiB VM's smaps")
	}
}

package main

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
)

// cpioEntry is one file or directory of an initramfs overlay.
type cpioEntry struct {
	name   string // absolute path in the guest
	mode   uint32 // permission bits
	dir    bool
	source string // host file with the content (regular files)
}

// writeInitramfs writes entries as a gzip-compressed "newc" cpio archive:
// the format the kernel unpacks as an initramfs, also when it follows
// another archive in the same initrd. Parent directories are added.
func writeInitramfs(w io.Writer, entries []cpioEntry) error {
	dirs := map[string]bool{}
	var all []cpioEntry
	for _, e := range entries {
		for d := path.Dir(e.name); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			all = append(all, cpioEntry{name: d, mode: 0o755, dir: true})
		}
		all = append(all, e)
	}
	// Parents first: shorter paths sort before their children.
	slices.SortStableFunc(all, func(a, b cpioEntry) int {
		if a.dir != b.dir {
			if a.dir {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	zw := gzip.NewWriter(w)
	for i, e := range all {
		var data []byte
		mode := e.mode | 0o040000
		if !e.dir {
			b, err := os.ReadFile(e.source)
			if err != nil {
				return err
			}
			data, mode = b, e.mode|0o100000
		}
		if err := cpioRecord(zw, uint32(i+1), mode, strings.TrimPrefix(e.name, "/"), data); err != nil {
			return err
		}
	}
	if err := cpioRecord(zw, 0, 0, "TRAILER!!!", nil); err != nil {
		return err
	}
	return zw.Close()
}

// cpioRecord writes one newc header, name and data, each padded to 4 bytes.
func cpioRecord(w io.Writer, ino, mode uint32, name string, data []byte) error {
	nlink := uint32(1)
	if mode&0o040000 != 0 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	buf := append([]byte(hdr), name...)
	buf = append(buf, 0)
	buf = append(buf, make([]byte, pad4(len(buf)))...)
	buf = append(buf, data...)
	buf = append(buf, make([]byte, pad4(len(data)))...)
	_, err := w.Write(buf)
	return err
}

func pad4(n int) int { return (4 - n%4) % 4 }

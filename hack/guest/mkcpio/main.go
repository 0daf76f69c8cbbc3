// Command mkcpio packs a directory tree into a gzip-compressed "newc" cpio
// archive suitable as a Linux initramfs, without needing root: device nodes
// (such as /dev/console, which the kernel opens before /init runs) are
// added from the command line instead of from the file system.
//
// The output is deterministic: entries are sorted, every owner is 0:0,
// every mtime is SOURCE_DATE_EPOCH (or 0), permissions are normalized to
// 0755 for directories and executables, 0644 for other files, and the gzip
// header carries no name or timestamp.
//
//	mkcpio -root staging -out initrd.img -node /dev/console:c:5:1:0600
package main

import (
	"bufio"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/kvm-shim/containerd-shim-kvm-v1/hack/internal/pack"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
)

// File type bits of the cpio mode field.
const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeSymlink = 0o120000
	modeChar    = 0o020000
	modeBlock   = 0o060000
)

type entry struct {
	name         string // relative, no leading slash
	mode         uint32 // type and permission bits
	source       string // host path for regular files
	link         string // symlink target
	major, minor uint32 // device numbers for nodes
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkcpio:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("mkcpio", flag.ContinueOnError)
	root := fl.String("root", "", "directory to pack (required)")
	out := fl.String("out", "", "output file, gzip'd newc cpio (required)")
	var nodes multiFlag
	fl.Var(&nodes, "node", "add a device node: /path:c|b:major:minor:mode (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *root == "" || *out == "" || fl.NArg() != 0 {
		return fmt.Errorf("usage: mkcpio -root DIR -out FILE [-node /dev/console:c:5:1:0600]")
	}
	mtime := uint32(0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		v, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return fmt.Errorf("bad SOURCE_DATE_EPOCH %q", s)
		}
		mtime = uint32(v)
	}
	entries, err := collect(*root)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		e, parseNodeErr := parseNode(n)
		if parseNodeErr != nil {
			return parseNodeErr
		}
		entries = append(entries, e)
	}
	entries, err = finish(entries)
	if err != nil {
		return err
	}
	return writeFile(*out, entries, mtime)
}

func parseNode(s string) (entry, error) {
	f := strings.Split(s, ":")
	if len(f) != 5 || !strings.HasPrefix(f[0], "/") || path.Clean(f[0]) == "/" {
		return entry{}, fmt.Errorf("bad -node %q: want /path:c|b:major:minor:mode", s)
	}
	major, err1 := strconv.ParseUint(f[2], 10, 32)
	minor, err2 := strconv.ParseUint(f[3], 10, 32)
	perm, err3 := strconv.ParseUint(f[4], 8, 32)
	if err1 != nil || err2 != nil || err3 != nil || perm > 0o7777 {
		return entry{}, fmt.Errorf("bad -node %q: bad number", s)
	}
	var typ uint32
	switch f[1] {
	case "c":
		typ = modeChar
	case "b":
		typ = modeBlock
	default:
		return entry{}, fmt.Errorf("bad -node %q: type must be c or b", s)
	}
	return entry{
		name:  strings.TrimPrefix(path.Clean(f[0]), "/"),
		mode:  typ | uint32(perm),
		major: uint32(major),
		minor: uint32(minor),
	}, nil
}

// collect walks root and returns its directories, files and symlinks.
func collect(root string) ([]entry, error) {
	var entries []entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			entries = append(entries, entry{name: name, mode: modeDir | 0o755})
		case info.Mode().IsRegular():
			perm := uint32(0o644)
			if info.Mode().Perm()&0o111 != 0 {
				perm = 0o755
			}
			entries = append(entries, entry{name: name, mode: modeFile | perm, source: p})
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			entries = append(entries, entry{name: name, mode: modeSymlink | 0o777, link: target})
		default:
			return fmt.Errorf("%s: unsupported file type %v", p, info.Mode().Type())
		}
		return nil
	})
	return entries, err
}

// finish rejects duplicates, adds missing parent directories and sorts.
func finish(entries []entry) ([]entry, error) {
	seen := map[string]entry{}
	for _, e := range entries {
		if _, dup := seen[e.name]; dup {
			return nil, fmt.Errorf("/%s given twice", e.name)
		}
		seen[e.name] = e
	}
	for name := range seen {
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			p, ok := seen[dir]
			if !ok {
				seen[dir] = entry{name: dir, mode: modeDir | 0o755}
			} else if p.mode&0o170000 != modeDir {
				return nil, fmt.Errorf("/%s is not a directory", dir)
			}
		}
	}
	out := make([]entry, 0, len(seen))
	for _, e := range seen {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

func writeFile(out string, entries []entry, mtime uint32) error {
	// Atomic, not synced: the build takes an output's existence for "up
	// to date", so an interrupted build must not leave half an archive;
	// after a power loss the archive is simply built again.
	return atomicfile.Write(out, atomicfile.Options{Perm: 0o644, Durability: atomicfile.NoSync}, func(w io.Writer) error {
		bw := bufio.NewWriter(w)
		zw, err := gzip.NewWriterLevel(bw, gzip.BestCompression)
		if err != nil {
			return err
		}
		if err := writeCpio(zw, entries, mtime); err != nil {
			return err
		}
		if err := zw.Close(); err != nil {
			return err
		}
		return bw.Flush()
	})
}

// cw tracks the byte offset so that the 4-byte alignment can be kept.
type cw struct {
	w   io.Writer
	off int64
}

func (c *cw) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.off += int64(n)
	return n, err
}

func (c *cw) pad() error {
	if r := c.off % 4; r != 0 {
		_, err := c.Write(make([]byte, 4-r))
		return err
	}
	return nil
}

func (c *cw) header(ino uint32, e entry, mtime uint32, size int64) error {
	nlink := uint32(1)
	if e.mode&0o170000 == modeDir {
		nlink = 2
	}
	if size > 0xffffffff {
		return fmt.Errorf("/%s: too large for cpio", e.name)
	}
	_, err := fmt.Fprintf(c, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\x00",
		ino, e.mode, 0, 0, nlink, mtime, uint32(size), 0, 0, e.major, e.minor, len(e.name)+1, 0, e.name)
	if err != nil {
		return err
	}
	return c.pad()
}

func writeCpio(w io.Writer, entries []entry, mtime uint32) error {
	c := &cw{w: w}
	for i, e := range entries {
		ino := uint32(i + 1)
		switch e.mode & 0o170000 {
		case modeFile:
			if err := copyFile(c, ino, e, mtime); err != nil {
				return err
			}
		case modeSymlink:
			if err := c.header(ino, e, mtime, int64(len(e.link))); err != nil {
				return err
			}
			if _, err := io.WriteString(c, e.link); err != nil {
				return err
			}
		default:
			if err := c.header(ino, e, mtime, 0); err != nil {
				return err
			}
		}
		if err := c.pad(); err != nil {
			return err
		}
	}
	return c.header(0, entry{name: "TRAILER!!!"}, 0, 0)
}

func copyFile(c *cw, ino uint32, e entry, mtime uint32) error {
	return pack.CopyFile(c, e.source, func(size int64) error { return c.header(ino, e, mtime, size) })
}

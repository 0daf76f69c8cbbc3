// Command kvm-guest-iobench measures storage inside the test guest, for
// kvmbench's volumes section: sequential read and write (1 MiB blocks) and
// 4 KiB random read and write, on a disk found by its virtio serial or on a
// file in a directory (a virtiofs share). /init runs it when the kernel
// command line has kvm-guest.iobench=<target>,<MiB>,<ops>,<runs>, where
// target is disk:<serial> or dir:<path>. It prints on stdout (the console):
//
//	KVM-GUEST-IO start <target> mode=<direct|cached> mib=<n> ops=<n> runs=<n>
//	KVM-GUEST-IO run <i> seqwrite <MiB/s> seqread <MiB/s> randwrite <IOPS> randread <IOPS>
//	KVM-GUEST-IO done
//	KVM-GUEST-IO-FAIL <why>
//
// I/O bypasses the guest's page cache with O_DIRECT (mode=direct); where
// the target refuses O_DIRECT it uses the cache, syncs after writes and
// drops the caches before reads (mode=cached). Writes end with fdatasync,
// counted in their time. Random offsets come from a fixed seed per run, so
// every target sees the same pattern.
package main

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	seqBlock  = 1 << 20
	randBlock = 4096
)

type params struct {
	target    string // disk:<serial> or dir:<path>
	mib       int    // bytes touched, MiB
	ops, runs int
}

func parse(arg string) (params, error) {
	f := strings.Split(arg, ",")
	if len(f) != 4 {
		return params{}, fmt.Errorf("%q: want <disk:serial|dir:path>,<MiB>,<ops>,<runs>", arg)
	}
	p := params{target: f[0]}
	if !strings.HasPrefix(p.target, "disk:") && !strings.HasPrefix(p.target, "dir:") {
		return p, fmt.Errorf("target %q: want disk:<serial> or dir:<path>", p.target)
	}
	for i, dst := range []*int{&p.mib, &p.ops, &p.runs} {
		n, err := strconv.Atoi(f[i+1])
		if err != nil || n < 1 {
			return p, fmt.Errorf("%q is not a positive whole number", f[i+1])
		}
		*dst = n
	}
	return p, nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Println("KVM-GUEST-IO-FAIL usage: kvm-guest-iobench <disk:serial|dir:path>,<MiB>,<ops>,<runs>")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Println("KVM-GUEST-IO-FAIL", err)
		os.Exit(1)
	}
	fmt.Println("KVM-GUEST-IO done")
}

func run(arg string) error {
	p, err := parse(arg)
	if err != nil {
		return err
	}
	path, err := resolve(p.target)
	if err != nil {
		return err
	}
	f, direct, err := open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf, err := syscall.Mmap(-1, 0, seqBlock, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	rand.New(rand.NewSource(1)).Read(buf) // not zeros: nothing may skip them
	mode := map[bool]string{true: "direct", false: "cached"}[direct]
	fmt.Printf("KVM-GUEST-IO start %s mode=%s mib=%d ops=%d runs=%d\n", p.target, mode, p.mib, p.ops, p.runs)
	size := int64(p.mib) << 20
	for i := 1; i <= p.runs; i++ {
		sw, err := timed(func() error { return seqWrite(f, buf, size) })
		if err != nil {
			return fmt.Errorf("sequential write: %w", err)
		}
		sr, err := timed(func() error { return seqRead(f, buf, size, direct) })
		if err != nil {
			return fmt.Errorf("sequential read: %w", err)
		}
		rw, err := timed(func() error {
			return randIO(f, buf[:randBlock], randPass{size: size, ops: p.ops, seed: int64(i), write: true, direct: direct})
		})
		if err != nil {
			return fmt.Errorf("random write: %w", err)
		}
		rr, err := timed(func() error {
			return randIO(f, buf[:randBlock], randPass{size: size, ops: p.ops, seed: int64(i), direct: direct})
		})
		if err != nil {
			return fmt.Errorf("random read: %w", err)
		}
		mib := float64(p.mib)
		fmt.Printf("KVM-GUEST-IO run %d seqwrite %.2f seqread %.2f randwrite %.1f randread %.1f\n",
			i, mib/sw.Seconds(), mib/sr.Seconds(), float64(p.ops)/rw.Seconds(), float64(p.ops)/rr.Seconds())
	}
	return nil
}

// resolve finds the disk with the serial (waiting up to 10 s for it) or
// names the benchmark file in the directory.
func resolve(target string) (string, error) {
	if dir, ok := strings.CutPrefix(target, "dir:"); ok {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return "", fmt.Errorf("%s is not a directory (%v)", dir, err)
		}
		return filepath.Join(dir, "kvm-guest-iobench.dat"), nil
	}
	serial := strings.TrimPrefix(target, "disk:")
	for range 200 {
		m, _ := filepath.Glob("/sys/block/vd*/serial")
		for _, s := range m {
			if b, err := os.ReadFile(s); err == nil && strings.TrimSpace(string(b)) == serial {
				return "/dev/" + filepath.Base(filepath.Dir(s)), nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("no disk with serial %s", serial)
}

// open opens path for direct I/O, or through the page cache when the
// file system refuses O_DIRECT.
func open(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o644)
	if err == nil {
		return f, true, nil
	}
	if !errors.Is(err, syscall.EINVAL) {
		return nil, false, err
	}
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	return f, false, err
}

func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

func seqWrite(f *os.File, buf []byte, size int64) error {
	for off := int64(0); off < size; off += seqBlock {
		if _, err := f.WriteAt(buf, off); err != nil {
			return err
		}
	}
	return syscall.Fdatasync(int(f.Fd()))
}

func seqRead(f *os.File, buf []byte, size int64, direct bool) error {
	if err := dropCaches(direct); err != nil {
		return err
	}
	for off := int64(0); off < size; off += seqBlock {
		if _, err := f.ReadAt(buf, off); err != nil {
			return err
		}
	}
	return nil
}

// randPass is one pass of random I/O: ops 4 KiB reads or writes (write)
// at block-aligned offsets below size, the same offsets for the same
// seed; direct: the file is open with O_DIRECT.
type randPass struct {
	size          int64
	ops           int
	seed          int64
	write, direct bool
}

// randIO does the pass p on f with buf.
func randIO(f *os.File, buf []byte, p randPass) error {
	size, ops, seed, write, direct := p.size, p.ops, p.seed, p.write, p.direct
	if !write {
		if err := dropCaches(direct); err != nil {
			return err
		}
	}
	r := rand.New(rand.NewSource(seed))
	blocks := size / randBlock
	for range ops {
		off := r.Int63n(blocks) * randBlock
		var err error
		if write {
			_, err = f.WriteAt(buf, off)
		} else {
			_, err = f.ReadAt(buf, off)
		}
		if err != nil {
			return err
		}
	}
	if write {
		return syscall.Fdatasync(int(f.Fd()))
	}
	return nil
}

// dropCaches empties the guest's page cache before a cached read.
func dropCaches(direct bool) error {
	if direct {
		return nil
	}
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

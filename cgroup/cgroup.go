package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/procfs"
)

// V1Controllers are the v1 hierarchies a VM is charged to; pids is used
// where it is mounted.
var V1Controllers = []string{"memory", "cpu", "cpuacct", "pids"}

// V2Controllers are enabled below the unified hierarchy's root for a VM.
var V2Controllers = []string{"memory", "cpu", "pids"}

// required v1 hierarchies: without them a VM cannot be accounted.
var v1Required = []string{"memory", "cpu", "cpuacct"}

// Hierarchies is where the host mounts its cgroup controllers.
type Hierarchies struct {
	// Unified is the cgroup v2 mount point when the host runs cgroup v2
	// only (/sys/fs/cgroup is cgroup2); "" on cgroup v1 and hybrid hosts.
	Unified string
	// V1 maps each v1 controller of V1Controllers to its mount point.
	V1 map[string]string

	// fake marks a test's tree in a plain directory, where the files
	// cgroupfs makes in every new group do not appear by themselves:
	// writeFile creates them there. Never set outside this package's tests.
	fake bool
}

// Version is 1 or 2.
func (h Hierarchies) Version() int {
	if h.Unified != "" {
		return 2
	}
	return 1
}

// DefaultRoot is where cgroup file systems are mounted.
const DefaultRoot = "/sys/fs/cgroup"

// Detect reads the host's cgroup mounts from /proc/self/mountinfo.
func Detect() (Hierarchies, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return Hierarchies{}, err
	}
	defer f.Close()
	return ParseMountinfo(f, DefaultRoot)
}

// ParseMountinfo finds the cgroup hierarchies in a mountinfo listing:
// cgroup v2 when root itself is a cgroup2 mount, else the v1 mounts of
// V1Controllers (a v2 mount elsewhere, as hybrid hosts have, is ignored).
func ParseMountinfo(r io.Reader, root string) (Hierarchies, error) {
	h := Hierarchies{V1: map[string]string{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		mnt := procfs.UnescapeMountinfo(f[4])
		switch g[0] {
		case "cgroup2":
			if mnt == root {
				h.Unified = mnt
			}
		case "cgroup":
			for _, opt := range strings.Split(g[2], ",") {
				if slices.Contains(V1Controllers, opt) {
					if _, seen := h.V1[opt]; !seen {
						h.V1[opt] = mnt
					}
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Hierarchies{}, err
	}
	if h.Unified != "" {
		h.V1 = nil
		return h, nil
	}
	for _, c := range v1Required {
		if h.V1[c] == "" {
			return Hierarchies{}, fmt.Errorf("cgroup v1 controller %s is not mounted: a VM could not be charged to its pod: %w", c,
				errdefs.ErrFailedPrecondition)
		}
	}
	return h, nil
}

// ErrSystemdPath is returned for a cgroupsPath in systemd's
// "slice:prefix:name" form, which needs systemd to create the scope.
var ErrSystemdPath = errors.New("cgroupsPath is in systemd's slice:prefix:name form")

// CleanPath checks a cgroupsPath from an OCI spec: absolute, no "..", not
// the root cgroup itself. The result is clean, so joined to a mount point
// it always stays below it.
func CleanPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") && strings.Count(p, ":") == 2 {
		return "", fmt.Errorf("%q: %w", p, ErrSystemdPath)
	}
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("cgroupsPath %q is not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	for _, e := range strings.Split(p, "/") {
		if e == ".." || e == "." {
			return "", fmt.Errorf("cgroupsPath %q contains %q: %w", p, e, errdefs.ErrInvalidArgument)
		}
	}
	if strings.ContainsAny(p, "\x00\n") {
		return "", fmt.Errorf("cgroupsPath %q contains a control character: %w", p, errdefs.ErrInvalidArgument)
	}
	c := filepath.Clean(p)
	if c == "/" {
		return "", fmt.Errorf("cgroupsPath %q is the root cgroup: a VM needs a cgroup of its own: %w", p, errdefs.ErrInvalidArgument)
	}
	return c, nil
}

// Group is one container's cgroup: the same path in every hierarchy used.
type Group struct {
	Path string
	h    Hierarchies
}

// Group returns the cgroup at path (checked with CleanPath).
func (h Hierarchies) Group(path string) (*Group, error) {
	c, err := CleanPath(path)
	if err != nil {
		return nil, err
	}
	return &Group{Path: c, h: h}, nil
}

// Dirs are the group's directories, one per hierarchy used.
func (g *Group) Dirs() []string {
	if g.h.Unified != "" {
		return []string{filepath.Join(g.h.Unified, g.Path)}
	}
	var dirs []string
	for _, c := range V1Controllers {
		if m := g.h.V1[c]; m != "" && !slices.Contains(dirs, filepath.Join(m, g.Path)) {
			dirs = append(dirs, filepath.Join(m, g.Path))
		}
	}
	return dirs
}

// dir returns the group's directory in controller c's hierarchy.
func (g *Group) dir(c string) string {
	if g.h.Unified != "" {
		return filepath.Join(g.h.Unified, g.Path)
	}
	if m := g.h.V1[c]; m != "" {
		return filepath.Join(m, g.Path)
	}
	return ""
}

// Create makes the group, and any missing parent, in every hierarchy, as
// runc would; on cgroup v2 it enables V2Controllers in each ancestor's
// cgroup.subtree_control. It reports whether the group itself was new: a
// caller removes only what it created. Parents are left, as runc leaves
// them (kubelet owns the pod's cgroup).
func (g *Group) Create() (created bool, err error) {
	if g.h.Unified != "" {
		return g.createV2()
	}
	for _, d := range g.Dirs() {
		made, err := mkdirLeaf(d)
		if err != nil {
			return created, err
		}
		created = created || made
	}
	return created, nil
}

func mkdirLeaf(d string) (bool, error) {
	if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
		return false, fmt.Errorf("create cgroup %s: %w", filepath.Dir(d), err)
	}
	if err := os.Mkdir(d, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("create cgroup %s: %w", d, err)
	}
	return true, nil
}

func (g *Group) createV2() (bool, error) {
	// Every ancestor delegates the controllers to its children, from the
	// root down; a missing one is created first.
	enable := "+" + strings.Join(V2Controllers, " +")
	dir := g.h.Unified
	elems := strings.Split(strings.TrimPrefix(g.Path, "/"), "/")
	for _, e := range elems {
		if err := g.h.writeFile(filepath.Join(dir, "cgroup.subtree_control"), enable); err != nil {
			return false, fmt.Errorf("enable %s below %s: %w", strings.Join(V2Controllers, ", "), dir, err)
		}
		dir = filepath.Join(dir, e)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return false, fmt.Errorf("create cgroup %s: %w", dir, err)
		} else if err == nil && dir == filepath.Join(g.h.Unified, g.Path) {
			return true, nil
		}
	}
	return false, nil
}

// Join moves process pid, with all its threads, into the group in every
// hierarchy. Threads it starts later are born there. Memory the process
// was charged for before stays where it was charged: Linux 6.x no longer
// moves charges (v1 memory.move_charge_at_immigrate is refused, v2 never
// had it), so a process should join before it allocates much.
func (g *Group) Join(pid int) error {
	for _, d := range g.Dirs() {
		if err := g.h.writeFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("move pid %d into cgroup %s: %w", pid, d, err)
		}
	}
	return nil
}

// Procs lists the processes in the group (of the memory hierarchy on v1).
func (g *Group) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(g.dir("memory"), "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, l := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(l)
		if err != nil {
			return nil, fmt.Errorf("cgroup.procs of %s: %q", g.Path, l)
		}
		pids = append(pids, n)
	}
	return pids, nil
}

// removeWait is how long Remove waits for the last task to leave: the
// kernel frees a cgroup's tasks a moment after a killed process is reaped.
const removeWait = 2 * time.Second

// Remove deletes the group's directory in every hierarchy (a missing one
// is already gone). Parents stay.
func (g *Group) Remove() error {
	var errs []error
	deadline := time.Now().Add(removeWait)
	for _, d := range g.Dirs() {
		for {
			err := unixRmdir(d)
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				break
			}
			if errors.Is(err, errBusy) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			break
		}
	}
	return errors.Join(errs...)
}

// writeFile writes one value to a cgroup file that exists (cgroupfs
// makes them; O_CREATE would only hide a wrong path), except that a fake
// tree in tests may lack it.
func (h Hierarchies) writeFile(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if errors.Is(err, fs.ErrNotExist) && h.fake {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	}
	if err != nil {
		return err
	}
	_, err = f.WriteString(v + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", v, path, err)
	}
	return nil
}

var errBusy = unix.EBUSY

func unixRmdir(d string) error {
	if err := unix.Rmdir(d); err != nil {
		return &fs.PathError{Op: "rmdir", Path: d, Err: err}
	}
	return nil
}

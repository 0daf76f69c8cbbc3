package hostid

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Child processes: the test binary re-run with -test.run=^TestHelperProcess$
// and HOSTID_TEST_ROLE naming what to do.
const (
	envRole  = "HOSTID_TEST_ROLE"
	envState = "HOSTID_TEST_STATE"
	envID    = "HOSTID_TEST_ID"
)

var processRange = Range{First: 70000, Last: 70063}

func childCmd(env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// TestHelperProcess is not a test: it is the body of the child processes.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("runs only as a child of the process tests")
	}
	s, err := OpenStore(os.Getenv(envState), processRange)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	switch role {
	case "allocate":
		// Allocate, print the ids, release half of them again.
		for i := range 8 {
			owner := fmt.Sprintf("%s-%d", os.Getenv(envID), i)
			id, err := s.Allocate(owner)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			fmt.Printf("%s %d\n", owner, id)
			if i%2 == 1 {
				if err := s.Release(owner); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				fmt.Printf("released %s\n", owner)
			}
		}
	case "hold":
		// Allocate, then wait to be killed: a shim that dies between
		// allocating and defining its domain.
		if _, err := s.Allocate("crashed"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("allocated")
		time.Sleep(time.Minute)
	}
	os.Exit(0)
}

// Shim processes allocate and release at once on one state file: no id is
// ever held by two owners, and the file ends with exactly what is held.
func TestProcessesShareTheStore(t *testing.T) {
	state := filepath.Join(t.TempDir(), "ids.json")
	const procs = 4
	cmds := make([]*exec.Cmd, procs)
	outs := make([]*strings.Builder, procs)
	for i := range procs {
		outs[i] = &strings.Builder{}
		cmds[i] = childCmd(envRole+"=allocate", envState+"="+state, envID+"="+strconv.Itoa(i))
		cmds[i].Stdout = outs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
	}
	held := map[string]uint32{}
	for _, o := range outs {
		sc := bufio.NewScanner(strings.NewReader(o.String()))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 2 && f[0] == "released" {
				delete(held, f[1])
				continue
			}
			n, _ := strconv.ParseUint(f[1], 10, 32)
			for other, id := range held {
				if id == uint32(n) {
					t.Fatalf("id %d given to %s while %s held it", n, f[0], other)
				}
			}
			held[f[0]] = uint32(n)
		}
	}
	s, err := OpenStore(state, processRange)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(snap) != fmt.Sprint(held) || len(held) != procs*4 {
		t.Fatalf("state holds %v, the children hold %v", snap, held)
	}
}

// A shim killed after allocating leaves its id in the file; the next
// reconcile frees it, since no domain names it and its process is gone.
func TestKilledHolderIsFreed(t *testing.T) {
	state := filepath.Join(t.TempDir(), "ids.json")
	cmd := childCmd(envRole+"=hold", envState+"="+state)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err = cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "allocated\n" {
		t.Fatalf("child said %q", line)
	}
	s, err := OpenStore(state, processRange)
	if err != nil {
		t.Fatal(err)
	}
	// While it lives, a reconcile keeps its id.
	if dropped, recErr := s.ReconcileWith(func() (map[string]uint32, error) { return nil, nil }); recErr != nil || len(dropped) != 0 {
		t.Fatalf("reconcile with the holder alive dropped %v (%v)", dropped, recErr)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	dropped, err := s.ReconcileWith(func() (map[string]uint32, error) { return nil, nil })
	if err != nil || fmt.Sprint(dropped) != "[crashed]" {
		t.Fatalf("reconcile after the holder died dropped %v (%v), want [crashed]", dropped, err)
	}
	if snap, _ := s.Snapshot(); len(snap) != 0 {
		t.Fatalf("state still holds %v", snap)
	}
}

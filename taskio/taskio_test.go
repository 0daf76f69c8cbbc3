package taskio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/runtime/v2/logging"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// helperNamespace marks the test binary run as a logging binary: the
// shim gives a logger CONTAINER_NAMESPACE as its environment.
const helperNamespace = "taskio-test-logger"

func TestMain(m *testing.M) {
	if os.Getenv("CONTAINER_NAMESPACE") == helperNamespace {
		helperLogger()
		return
	}
	os.Exit(m.Run())
}

// helperLogger is a logging binary built on containerd's own logger
// library, so it reads the streams the way real ones do. Its arguments
// (from the URI's query) are "mode M out PATH": it writes what it got to
// PATH.env, PATH.stdout and PATH.stderr. Modes: "copy" copies both
// streams to their end; "term" reads nothing and exits on SIGTERM;
// "stubborn" ignores EOF and SIGTERM; "never-ready" never closes fd 5.
func helperLogger() {
	args := map[string]string{}
	for i := 1; i+1 < len(os.Args); i += 2 {
		args[os.Args[i]] = os.Args[i+1]
	}
	out := args["out"]
	logging.Run(func(ctx context.Context, cfg *logging.Config, ready func() error) error {
		env := fmt.Sprintf("id=%s namespace=%s args=%s path=%q", cfg.ID, cfg.Namespace, strings.Join(os.Args[1:], " "), os.Getenv("PATH"))
		if err := os.WriteFile(out+".env", []byte(env), 0o600); err != nil {
			return err
		}
		if args["mode"] == "never-ready" {
			select {}
		}
		if err := ready(); err != nil {
			return err
		}
		switch args["mode"] {
		case "term":
			<-ctx.Done()
			return nil
		case "stubborn":
			select {}
		}
		errs := make(chan error, 2)
		for _, s := range []struct {
			r    io.Reader
			name string
		}{{cfg.Stdout, ".stdout"}, {cfg.Stderr, ".stderr"}} {
			go func() {
				b, err := io.ReadAll(s.r)
				if err == nil {
					err = os.WriteFile(out+s.name, b, 0o600)
				}
				errs <- err
			}()
		}
		return errors.Join(<-errs, <-errs)
	})
}

// helperURI is a binary:// URI that runs this test binary as a logger.
func helperURI(t *testing.T, mode, out string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	q := url.Values{"mode": {mode}, "out": {out}}
	return (&url.URL{Scheme: "binary", Path: exe, RawQuery: q.Encode()}).String()
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// assertReaped fails unless pid is gone and was waited for (no zombie,
// no child of ours left).
func assertReaped(t *testing.T, pid int) {
	t.Helper()
	if _, err := unix.Wait4(pid, nil, unix.WNOHANG, nil); !errors.Is(err, unix.ECHILD) {
		t.Errorf("logger pid %d: wait4 says %v; want it reaped already (ECHILD)", pid, err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("logger pid %d still in /proc (%v)", pid, err)
	}
}

func TestBinaryLoggerGetsBothStreams(t *testing.T) {
	out := filepath.Join(t.TempDir(), "log")
	uri := helperURI(t, "copy", out)
	before := countFDs(t)
	o, err := OpenOutput(context.Background(), Stdio{Stdout: uri, Stderr: uri}, Options{ID: "c1", Namespace: helperNamespace})
	if err != nil {
		t.Fatal(err)
	}
	pid := o.logger.cmd.Process.Pid
	// Ready means it runs: its environment file is there before any output.
	wantEnv := "id=c1 namespace=" + helperNamespace + " args=mode copy out " + out + ` path=""`
	if b, err := os.ReadFile(out + ".env"); err != nil || !strings.HasPrefix(string(b), wantEnv) {
		t.Fatalf("logger saw %q (%v); want the id, the namespace, the query as sorted arguments and no other environment", b, err)
	}
	if _, err := io.WriteString(o.Stdout, "to stdout\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(o.Stderr, "to stderr\n"); err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatalf("close: %v (a logger that exits at EOF needs no signal)", err)
	}
	for name, want := range map[string]string{".stdout": "to stdout\n", ".stderr": "to stderr\n"} {
		if b, err := os.ReadFile(out + name); err != nil || string(b) != want {
			t.Errorf("logger wrote %s %q (%v), want %q", name, b, err, want)
		}
	}
	assertReaped(t, pid)
	if after := countFDs(t); after > before {
		t.Errorf("%d descriptors open before, %d after", before, after)
	}
	if err := o.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// A logger that does not exit at EOF gets SIGTERM; one that ignores
// that too is killed. Either way it is reaped when Close returns. (The
// waits are generous: a test binary built with -race sleeps 1 s in its
// exit.)
func TestBinaryLoggerStopEscalates(t *testing.T) {
	for _, tc := range []struct{ mode, want string }{
		{"term", "needed SIGTERM"},
		{"stubborn", "ignored EOF and SIGTERM; killed"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "log")
			before := countFDs(t)
			o, err := OpenOutput(context.Background(), Stdio{Stdout: helperURI(t, tc.mode, out)},
				Options{Namespace: helperNamespace, LoggerStop: 1500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			pid := o.logger.cmd.Process.Pid
			if err := o.Close(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("close: %v; want %q", err, tc.want)
			}
			assertReaped(t, pid)
			if after := countFDs(t); after > before {
				t.Errorf("%d descriptors open before, %d after", before, after)
			}
		})
	}
}

func TestBinaryLoggerNeverReady(t *testing.T) {
	out := filepath.Join(t.TempDir(), "log")
	before := countFDs(t)
	_, err := OpenOutput(context.Background(), Stdio{Stdout: helperURI(t, "never-ready", out)},
		Options{Namespace: helperNamespace, LoggerReady: 1500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "did not get ready (close fd 5) within 1.5s") {
		t.Fatalf("got %v", err)
	}
	// It did run (it wrote its environment), and it is gone and reaped.
	if _, serr := os.Stat(out + ".env"); serr != nil {
		t.Fatalf("the logger never ran: %v", serr)
	}
	if _, werr := unix.Wait4(-1, nil, unix.WNOHANG, nil); !errors.Is(werr, unix.ECHILD) {
		t.Errorf("a child is left: wait4 says %v", werr)
	}
	if after := countFDs(t); after > before {
		t.Errorf("%d descriptors open before, %d after", before, after)
	}
}

// A binary that cannot be executed (not an ELF file) fails at its start,
// with nothing left.
func TestBinaryLoggerCannotStart(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "logger")
	if err := os.WriteFile(bin, []byte("not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := countFDs(t)
	_, err := OpenOutput(context.Background(), Stdio{Stdout: "binary://" + bin}, Options{})
	if err == nil || !strings.Contains(err.Error(), "start logging binary "+bin) {
		t.Fatalf("got %v", err)
	}
	if after := countFDs(t); after > before {
		t.Errorf("%d descriptors open before, %d after", before, after)
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := "binary://" + exe + "?a=b"
	for _, tc := range []struct {
		name string
		s    Stdio
		want string // "" accepted
		kind func(error) bool
	}{
		{"fifo paths", Stdio{Stdin: "/run/x/in", Stdout: "/run/x/out", Stderr: "/run/x/err"}, "", nil},
		{"fifo scheme", Stdio{Stdin: "fifo:///run/x/in", Stdout: "fifo:///run/x/out"}, "", nil},
		{"file", Stdio{Stdout: "file:///var/log/x", Stderr: "file:///var/log/x"}, "", nil},
		{"binary both", Stdio{Stdout: bin, Stderr: bin}, "", nil},
		{"binary stdout only", Stdio{Stdout: bin}, "", nil},
		{"missing binary", Stdio{Stdout: "binary:///nonexistent/logger?x=1"},
			`stdout "binary:///nonexistent/logger?x=1": logging binary /nonexistent/logger does not exist`, errdefs.IsInvalidArgument},
		{"binary not executable", Stdio{Stdout: "binary://" + plain}, "is not an executable file", errdefs.IsInvalidArgument},
		{"binary directory", Stdio{Stdout: "binary://" + dir}, "is not an executable file", errdefs.IsInvalidArgument},
		{"binary relative", Stdio{Stdout: "binary:logger"}, "the path must be absolute", errdefs.IsInvalidArgument},
		{"binary and fifo", Stdio{Stdout: bin, Stderr: "/run/x/err"}, "must be the same binary:// URI", errdefs.IsInvalidArgument},
		{"fifo and binary", Stdio{Stdout: "/run/x/out", Stderr: bin}, "must be the same binary:// URI", errdefs.IsInvalidArgument},
		{"stderr binary alone", Stdio{Stderr: bin}, "must be the same binary:// URI", errdefs.IsInvalidArgument},
		{"file relative", Stdio{Stdout: "file:log"}, "the path must be absolute", errdefs.IsInvalidArgument},
		{"binary with a host", Stdio{Stdout: "binary://usr/bin/logger"},
			`names host "usr": write binary:///absolute/path`, errdefs.IsInvalidArgument},
		{"file with a host", Stdio{Stdout: "file://var/log/x"}, `names host "var"`, errdefs.IsInvalidArgument},
		{"tcp", Stdio{Stdout: "tcp://host:1"}, `scheme "tcp" is not supported`, errdefs.IsNotImplemented},
		{"stdin file", Stdio{Stdin: "file:///in"}, "stdin is a FIFO path", errdefs.IsNotImplemented},
		{"bad url", Stdio{Stderr: "fifo://%zz"}, `stderr "fifo://%zz"`, errdefs.IsInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.s)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !tc.kind(err) {
				t.Fatalf("got %v; want %q", err, tc.want)
			}
		})
	}
}

// A refused URI opens nothing: the stdout FIFO before it stays unopened.
func TestOpenOutputRefusesFirst(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "out")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	before := countFDs(t)
	if _, err := OpenOutput(context.Background(), Stdio{Stdout: p, Stderr: "binary:///nonexistent"}, Options{FIFO: FIFOStream}); err == nil {
		t.Fatal("accepted")
	}
	if after := countFDs(t); after != before {
		t.Errorf("%d descriptors open before, %d after", before, after)
	}
}

func TestFileOutputAppends(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(p, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := OpenOutput(context.Background(), Stdio{Stdout: "file://" + p, Stderr: "file://" + p}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(o.Stdout, "out\n")
	_, _ = io.WriteString(o.Stderr, "err\n")
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old\nout\nerr\n" {
		t.Fatalf("file holds %q", b)
	}
}

// In FIFOWait mode an output FIFO opens without its reader, and a write
// (even of nothing) waits until the reader came.
func TestFIFOWaitWritesOnceTheReaderCame(t *testing.T) {
	p, o := waitModeFIFO(t)
	defer o.Close()
	wrote := make(chan error, 1)
	go func() {
		_, werr := o.Stdout.Write(nil)
		wrote <- werr
	}()
	select {
	case werr := <-wrote:
		t.Fatalf("the write returned before any reader (%v)", werr)
	case <-time.After(200 * time.Millisecond):
	}
	r, err := os.OpenFile(p, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the write never returned after the reader came")
	}
}

func TestOpenStdin(t *testing.T) {
	p := filepath.Join(t.TempDir(), "in")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	// No writer within the wait: an empty stdin.
	began := time.Now()
	if in, err := OpenStdin(context.Background(), p, 100*time.Millisecond); in != nil || err != nil {
		t.Fatalf("got %v, %v; want nil, nil", in, err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("took %v", took)
	}
	// A writer: the input comes through.
	go func() {
		w, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err == nil {
			_, _ = io.WriteString(w, "input")
			w.Close()
		}
	}()
	in, err := OpenStdin(context.Background(), "fifo://"+p, 5*time.Second)
	if err != nil || in == nil {
		t.Fatalf("got %v, %v", in, err)
	}
	defer in.Close()
	if b, _ := io.ReadAll(in); string(b) != "input" {
		t.Fatalf("read %q", b)
	}
	if _, err := OpenStdin(context.Background(), "binary:///x", 0); !errdefs.IsNotImplemented(err) {
		t.Fatalf("binary stdin: %v", err)
	}
}

func TestLoggerArgs(t *testing.T) {
	q, _ := url.ParseQuery("z=1&a=2&a=3&flag")
	if got := strings.Join(loggerArgs(q), ","); got != "a,2,flag,,z,1" {
		t.Fatalf("args %q", got)
	}
}

// A write that waits for a reader who never comes ends with Close.
func TestCloseEndsAWaitingWrite(t *testing.T) {
	_, o := waitModeFIFO(t)
	wrote := make(chan error, 1)
	go func() {
		_, err := o.Stdout.Write([]byte("nobody reads this"))
		wrote <- err
	}()
	time.Sleep(100 * time.Millisecond)
	_ = o.Close()
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("the write succeeded without a reader")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the write still waits after Close")
	}
}

// waitModeFIFO makes a FIFO with no reader and opens it as stdout in
// FIFOWait mode.
func waitModeFIFO(t *testing.T) (string, *Output) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "out")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := OpenOutput(context.Background(), Stdio{Stdout: p}, Options{FIFO: FIFOWait})
	if err != nil {
		t.Fatal(err)
	}
	return p, o
}

package taskio

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// containerd restarts while a VM runs: its reader of the stdout FIFO goes
// away and a new one comes. Output written in between never fails and
// never holds the writer for long, and output after the return reaches
// the new reader.
func TestStdoutFIFOSurvivesReaderRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stdout")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	openReader := func() *os.File {
		r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first := openReader()
	w, err := openStreamFIFO(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write := func(b []byte) {
		t.Helper()
		if n, err := w.Write(b); err != nil || n != len(b) {
			t.Fatalf("write %d bytes: %d, %v", len(b), n, err)
		}
	}
	write([]byte("before\n"))
	buf := make([]byte, 64)
	if n, _ := first.Read(buf); string(buf[:n]) != "before\n" {
		t.Fatalf("first reader got %q", buf[:n])
	}
	first.Close() // containerd is gone

	// Far more than the FIFO holds: the first write that finds it full
	// waits StallTimeout, the ones after it do not wait.
	start := time.Now()
	chunk := bytes.Repeat([]byte("x"), 4096)
	for i := 0; i < 64; i++ {
		write(chunk)
	}
	if took := time.Since(start); took > StallTimeout+2*time.Second {
		t.Errorf("256 KiB of output with no reader took %v", took)
	}
	if w.dropped.Load() == 0 {
		t.Error("nothing dropped although the FIFO was full")
	}

	second := openReader() // containerd is back
	defer second.Close()
	// It reads the backlog; once that is read, there is room again and
	// new output reaches it.
	var got bytes.Buffer
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(got.String(), "after") && time.Now().Before(deadline) {
		_ = second.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := second.Read(buf)
		got.Write(buf[:n])
		if err != nil { // nothing to read: the backlog is gone
			write([]byte("after\n"))
		}
	}
	if !strings.Contains(got.String(), "after") {
		t.Errorf("the new reader never got the output written after its return (%d bytes read)", got.Len())
	}
}

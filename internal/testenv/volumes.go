package testenv

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// AttachLoop writes a file of size bytes starting with first and attaches
// it as a loop device (a raw block volume, as a PVC's device stands in
// tests). detach gives the device back.
func AttachLoop(file string, size int64, first string) (dev string, detach func() error, err error) {
	data := make([]byte, size)
	copy(data, first)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return "", nil, err
	}
	return AttachLoopFile(context.Background(), file)
}

// AttachLoopFile attaches an existing file as a loop device, with
// losetup's options (such as --direct-io=on). detach gives the device
// back.
func AttachLoopFile(ctx context.Context, file string, options ...string) (dev string, detach func() error, err error) {
	args := append([]string{"--find", "--show"}, options...)
	out, err := exec.CommandContext(ctx, "losetup", append(args, file)...).Output()
	if err != nil {
		return "", nil, fmt.Errorf("losetup %s: %w", strings.Join(append(args, file), " "), err)
	}
	dev = strings.TrimSpace(string(out))
	return dev, func() error {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			return fmt.Errorf("losetup -d %s: %w: %s", dev, err, out)
		}
		return nil
	}, nil
}

// FirstLine reads the first line of a file or device, without its line
// end (and the zeros of a device's unwritten rest).
func FirstLine(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	l, _ := bufio.NewReader(f).ReadString('\n')
	return strings.TrimRight(l, "\n\x00"), nil
}

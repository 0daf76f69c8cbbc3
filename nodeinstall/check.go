package nodeinstall

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"regexp"
	"syscall"
)

// CheckRequest is what the shim's check is run with: paths on the node.
type CheckRequest struct {
	Shim, ShimConfig, ContainerdConfig string
}

// CheckResult is the outcome of `containerd-shim-kvm-v1 check`.
type CheckResult struct {
	Passed bool
	// Failed names the checks that printed FAIL.
	Failed []string
	Output string
}

// Checker runs the installed shim's check on the node.
type Checker interface {
	Check(ctx context.Context, r CheckRequest) (CheckResult, error)
}

// ChrootChecker runs the check chrooted into the host root, so that it
// sees the node's libvirt socket, QEMU, /dev and containerd config, not
// the installer image's.
type ChrootChecker struct {
	HostRoot string
}

// Check implements Checker.
func (c ChrootChecker) Check(ctx context.Context, r CheckRequest) (CheckResult, error) {
	cmd := exec.CommandContext(ctx, r.Shim, "check", "--config", r.ShimConfig, "--containerd-config", r.ContainerdConfig)
	if c.HostRoot != "/" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: c.HostRoot}
	}
	cmd.Dir = "/"
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	res := CheckResult{Passed: err == nil, Output: out.String(), Failed: FailedChecks(out.String())}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return res, err // it did not run
	}
	return res, nil
}

// check prints "LEVEL  name  note" in columns two or more spaces apart;
// a name may hold one space ("state dir").
var failLine = regexp.MustCompile(`(?m)^FAIL +(\S+(?: \S+)*?)(?:  |\s*$)`)

// FailedChecks names the checks that failed in check's output.
func FailedChecks(out string) []string {
	var names []string
	for _, m := range failLine.FindAllStringSubmatch(out, -1) {
		names = append(names, m[1])
	}
	return names
}

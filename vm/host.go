package vm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// KVMInfo says whether hardware virtualization can run stock guests here.
// It is detected once (DetectKVM) and passed around as data.
type KVMInfo struct {
	Usable bool
	Reason string // why not, or what was found
}

const kvmGetAPIVersion = 0xAE00 // _IO(KVMIO, 0x00)

// DetectKVM opens /dev/kvm and asks its API version. A paravirtualized KVM
// (the kvm_pvm module) answers but cannot boot stock guest kernels, so it
// counts as unusable.
func DetectKVM() KVMInfo {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return KVMInfo{Reason: fmt.Sprintf("/dev/kvm: %v", err)}
	}
	defer f.Close()
	v, err := unix.IoctlRetInt(int(f.Fd()), kvmGetAPIVersion)
	if err != nil {
		return KVMInfo{Reason: fmt.Sprintf("/dev/kvm: KVM_GET_API_VERSION: %v", err)}
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return KVMInfo{Reason: "/dev/kvm is paravirtualized KVM (kvm_pvm), which cannot boot stock guest kernels"}
	}
	return KVMInfo{Usable: true, Reason: fmt.Sprintf("/dev/kvm API version %d", v)}
}

// ChooseAccel resolves the configured mode ("auto", "kvm" or "tcg") against
// the host. With "auto" and no usable KVM it falls back to TCG and says why
// in the returned warning.
func ChooseAccel(mode string, kvm KVMInfo) (accel Accel, warning string, err error) {
	switch mode {
	case "", "auto":
		if kvm.Usable {
			return AccelKVM, "", nil
		}
		return AccelTCG, "KVM not usable (" + kvm.Reason + "); running guests under TCG, which is much slower", nil
	case "kvm":
		if !kvm.Usable {
			return "", "", errors.New("accel = \"kvm\" but KVM is not usable: " + kvm.Reason)
		}
		return AccelKVM, "", nil
	case "tcg":
		return AccelTCG, "", nil
	}
	return "", "", fmt.Errorf("accel = %q: want \"auto\", \"kvm\" or \"tcg\"", mode)
}

package netfd

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TAPPrefix starts the name of every TAP this package makes.
const TAPPrefix = "kvmtap"

// TAP describes the VM's TAP in the pod namespace.
type TAP struct {
	Name    string
	Queues  int  // IFF_MULTI_QUEUE queues, one per vCPU (capped by the caller)
	VNetHdr bool // IFF_VNET_HDR: offloads (TSO, checksum) through to the guest
	MTU     int
}

// tunOffloads are the offloads asked of a VNET_HDR TAP: checksum, TSO for
// IPv4 and IPv6, and ECN. QEMU narrows them to what the guest negotiated.
const tunOffloads = unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6 | unix.TUN_F_TSO_ECN

func (t TAP) flags() netlink.TuntapFlag {
	f := netlink.TUNTAP_NO_PI | netlink.TUNTAP_MULTI_QUEUE
	if t.VNetHdr {
		f |= netlink.TUNTAP_VNET_HDR
	}
	return f
}

// CreateTAP makes a persistent multi-queue TAP inside the pod namespace,
// with offloads set, the given MTU, and up. It stays when its file
// descriptors close, so QEMU can reopen its queues after a restart.
func CreateTAP(netnsPath string, t TAP) error {
	if t.Queues < 1 {
		t.Queues = 1
	}
	// Check the device first: the netlink library folds its errno into a
	// message, which would hide what is wrong.
	if _, _, err := Features(); err != nil {
		return fmt.Errorf("create TAP %s: /dev/net/tun unusable: %v: %w", t.Name, err, errdefs.ErrFailedPrecondition)
	}
	return inNetns(netnsPath, func(h *netlink.Handle) error {
		link := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: t.Name, MTU: t.MTU},
			Mode:      netlink.TUNTAP_MODE_TAP,
			Flags:     t.flags(),
			Queues:    t.Queues,
		}
		if err := h.LinkAdd(link); err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EPERM) {
				return fmt.Errorf("create TAP %s: /dev/net/tun unusable: %v: %w", t.Name, err, errdefs.ErrFailedPrecondition)
			}
			return fmt.Errorf("create TAP %s: %w", t.Name, err)
		}
		defer closeFiles(link.Fds)
		err := func() error {
			if t.VNetHdr {
				if err := ioctlInt(link.Fds[0], unix.TUNSETOFFLOAD, tunOffloads); err != nil {
					return fmt.Errorf("set offloads on TAP %s: %w", t.Name, err)
				}
			}
			if err := h.LinkSetMTU(link, t.MTU); err != nil {
				return fmt.Errorf("set MTU of TAP %s: %w", t.Name, err)
			}
			if err := h.LinkSetUp(link); err != nil {
				return fmt.Errorf("set TAP %s up: %w", t.Name, err)
			}
			return nil
		}()
		if err != nil {
			_ = h.LinkDel(link)
		}
		return err
	})
}

// OpenQueues opens n queues of an existing TAP, for QEMU.
func OpenQueues(netnsPath string, t TAP, n int) ([]*os.File, error) {
	var files []*os.File
	err := inNetns(netnsPath, func(h *netlink.Handle) error {
		for i := 0; i < n; i++ {
			fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open /dev/net/tun: %v: %w", err, errdefs.ErrFailedPrecondition)
			}
			f := os.NewFile(uintptr(fd), "tap-"+t.Name)
			files = append(files, f)
			var req ifreq
			copy(req.name[:unix.IFNAMSIZ-1], t.Name)
			req.flags = uint16(unix.IFF_TAP) | uint16(t.flags())
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); errno != 0 {
				return fmt.Errorf("attach queue %d of TAP %s: %w", i, t.Name, errno)
			}
		}
		return nil
	})
	if err != nil {
		closeFiles(files)
		return nil, err
	}
	return files, nil
}

// DeleteTAP removes the TAP. A TAP that is gone, or a namespace that is
// gone (which took the TAP with it), is not an error.
func DeleteTAP(netnsPath, name string) error {
	err := inNetns(netnsPath, func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			return fmt.Errorf("find TAP %s: %w", name, err)
		}
		if err := h.LinkDel(l); err != nil {
			return fmt.Errorf("delete TAP %s: %w", name, err)
		}
		return nil
	})
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// Features reports what the TAP offers (from TUNGETFEATURES), for check.
func Features() (vnetHdr, multiQueue bool, err error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, false, err
	}
	defer unix.Close(fd)
	var feat uint32
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNGETFEATURES, uintptr(unsafe.Pointer(&feat))); errno != 0 {
		return false, false, errno
	}
	return feat&unix.IFF_VNET_HDR != 0, feat&unix.IFF_MULTI_QUEUE != 0, nil
}

type ifreq struct {
	name  [unix.IFNAMSIZ]byte
	flags uint16
	_     [22]byte
}

func ioctlInt(f *os.File, req uint, v int) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(v)); errno != 0 {
		return errno
	}
	return nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

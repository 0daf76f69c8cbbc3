package netfd

import (
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// filterPrio is the priority of our redirect filters, so teardown removes
// exactly them and nothing CNI or anyone else added.
const filterPrio = 49152

// Wire redirects every frame that arrives on the CNI interface to the TAP
// and every frame from the TAP out of the CNI interface: an ingress qdisc
// and a match-all u32 filter with a mirred egress redirect on each side.
// It reports whether it created the CNI interface's ingress qdisc, so
// Unwire can leave a qdisc that was there before.
func Wire(netnsPath, podIf, tap string) (createdQdisc bool, err error) {
	err = inNetns(netnsPath, func(h *netlink.Handle) error {
		pod, err := h.LinkByName(podIf)
		if err != nil {
			return fmt.Errorf("find CNI interface %s: %w", podIf, err)
		}
		t, err := h.LinkByName(tap)
		if err != nil {
			return fmt.Errorf("find TAP %s: %w", tap, err)
		}
		if createdQdisc, err = ensureIngress(h, pod); err != nil {
			return err
		}
		if _, err := ensureIngress(h, t); err != nil {
			return err
		}
		if err := h.FilterReplace(redirect(pod, t)); err != nil {
			return fmt.Errorf("redirect %s to %s: %w", podIf, tap, err)
		}
		if err := h.FilterReplace(redirect(t, pod)); err != nil {
			return fmt.Errorf("redirect %s to %s: %w", tap, podIf, err)
		}
		return nil
	})
	return createdQdisc, err
}

// Unwire removes our filters (and the CNI interface's ingress qdisc when
// Wire created it), leaving the interface as CNI made it. Anything already
// gone is fine.
func Unwire(netnsPath, podIf string, removeQdisc bool) error {
	err := inNetns(netnsPath, func(h *netlink.Handle) error {
		pod, err := h.LinkByName(podIf)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			return fmt.Errorf("find CNI interface %s: %w", podIf, err)
		}
		if removeQdisc {
			err := h.QdiscDel(ingress(pod))
			if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("remove ingress qdisc of %s: %w", podIf, err)
			}
			return nil
		}
		filters, err := h.FilterList(pod, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return nil // no ingress qdisc: no filters either
		}
		for _, f := range filters {
			if f.Attrs().Priority == filterPrio {
				if err := h.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("remove redirect filter of %s: %w", podIf, err)
				}
			}
		}
		return nil
	})
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

func ingress(l netlink.Link) *netlink.Ingress {
	return &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: l.Attrs().Index,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_INGRESS,
	}}
}

func ensureIngress(h *netlink.Handle, l netlink.Link) (bool, error) {
	qs, err := h.QdiscList(l)
	if err != nil {
		return false, fmt.Errorf("list qdiscs of %s: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Type() == "ingress" {
			return false, nil
		}
	}
	if err := h.QdiscAdd(ingress(l)); err != nil {
		return false, fmt.Errorf("add ingress qdisc to %s: %w", l.Attrs().Name, err)
	}
	return true, nil
}

func redirect(from, to netlink.Link) *netlink.U32 {
	return &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from.Attrs().Index,
			Parent:    netlink.HANDLE_MIN_INGRESS,
			Priority:  filterPrio,
			Protocol:  unix.ETH_P_ALL,
		},
		Actions: []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
	}
}

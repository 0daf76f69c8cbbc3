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
//
// A pod's network serves one VM: while another TAP's redirect is on the
// CNI interface, Wire fails with FailedPrecondition. A redirect to a TAP
// that is gone (left by a shim that died) is removed. If Wire fails
// halfway, it takes back what it added.
func Wire(netnsPath, podIf, tap string) (createdQdisc bool, retErr error) {
	retErr = inNetns(netnsPath, func(h *netlink.Handle) error {
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
		wired := false
		defer func() {
			if !wired {
				_ = unwire(h, pod, t.Attrs().Index, createdQdisc)
			}
		}()
		redirects, err := ourRedirects(h, pod)
		if err != nil {
			return err
		}
		removedStale := false
		for _, r := range redirects {
			other, err := h.LinkByIndex(r.target)
			if err != nil {
				if err := h.FilterDel(r.filter); err != nil && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("remove the redirect of %s to a TAP that is gone: %w", podIf, err)
				}
				removedStale = true
				continue
			}
			if r.target != t.Attrs().Index {
				return fmt.Errorf("%s already carries the network of another VM (to %s): a pod's network serves one VM: %w",
					podIf, other.Attrs().Name, errdefs.ErrFailedPrecondition)
			}
		}
		if removedStale && !createdQdisc {
			// A qdisc that carried only a dead VM's redirect is taken for
			// that VM's, and this one removes it when it goes. (Nothing
			// records who made it; an empty ingress qdisc that CNI or an
			// admin added before the dead VM would go too, which changes
			// no traffic.)
			if rest, err := h.FilterList(pod, netlink.HANDLE_MIN_INGRESS); err == nil && len(rest) == 0 {
				createdQdisc = true
			}
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
		wired = true
		return nil
	})
	return createdQdisc, retErr
}

// Unwire removes the redirect of the CNI interface to the TAP (and the
// interface's ingress qdisc when Wire created it and no other redirect of
// ours is left), leaving the interface as CNI made it. The TAP's own
// filter goes with the TAP. Anything already gone is fine; a redirect to
// a TAP that is gone counts as this one's.
func Unwire(netnsPath, podIf, tap string, removeQdisc bool) error {
	err := inNetns(netnsPath, func(h *netlink.Handle) error {
		pod, err := h.LinkByName(podIf)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			return fmt.Errorf("find CNI interface %s: %w", podIf, err)
		}
		index := 0 // the TAP is gone: its redirect points nowhere
		if t, err := h.LinkByName(tap); err == nil {
			index = t.Attrs().Index
		}
		return unwire(h, pod, index, removeQdisc)
	})
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// unwire removes pod's redirects to the link with index tap (0: none) and
// to links that are gone; and pod's ingress qdisc, if removeQdisc and no
// redirect of ours is left on it.
func unwire(h *netlink.Handle, pod netlink.Link, tap int, removeQdisc bool) error {
	redirects, err := ourRedirects(h, pod)
	if err != nil {
		return nil // no ingress qdisc: no filters either
	}
	left := 0
	for _, r := range redirects {
		if r.target != tap {
			if _, err := h.LinkByIndex(r.target); err == nil {
				left++ // another VM's, live
				continue
			}
		}
		if err := h.FilterDel(r.filter); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove redirect filter of %s: %w", pod.Attrs().Name, err)
		}
	}
	if removeQdisc && left == 0 {
		err := h.QdiscDel(ingress(pod))
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("remove ingress qdisc of %s: %w", pod.Attrs().Name, err)
		}
	}
	return nil
}

type podRedirect struct {
	filter netlink.Filter
	target int // ifindex the frames go to; 0 if the filter has no redirect
}

// ourRedirects lists the filters of our priority on l's ingress.
func ourRedirects(h *netlink.Handle, l netlink.Link) ([]podRedirect, error) {
	filters, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return nil, fmt.Errorf("list filters of %s: %w", l.Attrs().Name, err)
	}
	var out []podRedirect
	for _, f := range filters {
		if f.Attrs().Priority != filterPrio {
			continue
		}
		r := podRedirect{filter: f}
		if u, ok := f.(*netlink.U32); ok {
			for _, a := range u.Actions {
				if m, ok := a.(*netlink.MirredAction); ok {
					r.target = m.Ifindex
				}
			}
		}
		out = append(out, r)
	}
	return out, nil
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

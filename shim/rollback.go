package shim

// rollback collects the undo of each step of a multi-step setup as soon as
// the step succeeds; run undoes them in reverse order.
type rollback []func()

func (r *rollback) add(undo func()) { *r = append(*r, undo) }

func (r rollback) run() {
	for i := len(r) - 1; i >= 0; i-- {
		r[i]()
	}
}

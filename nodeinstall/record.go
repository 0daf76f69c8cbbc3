package nodeinstall

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
)

// original is a containerd configuration file as it was before the
// installer first changed it.
type original struct {
	Exists bool        `json:"exists"`
	Data   []byte      `json:"data,omitempty"`
	Mode   os.FileMode `json:"mode,omitempty"`
}

// record is what the installer changed on a node, kept in its state dir
// across pod restarts, upgrades and downgrades until uninstall.
type record struct {
	// Originals are the containerd configuration files by node path, as
	// they were before the first install; an upgrade never replaces one.
	Originals map[string]original `json:"originals"`
	// Written is the sha256 of what the installer last wrote to each
	// node path (configs, binaries, the shim config): uninstall removes
	// or restores only what is still the installer's.
	Written map[string]string `json:"written"`
	// ShimConfigCreated: the shim config did not exist before.
	ShimConfigCreated bool `json:"shim_config_created"`
	// RestartPending: containerd's configuration was changed and
	// containerd has not been restarted since (the restart failed, or the
	// installer died first): the next run restarts it.
	RestartPending bool `json:"restart_pending,omitempty"`
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// loadRecord reads the record; ok is false when there is none.
func (l Layout) loadRecord() (rec *record, ok bool, err error) {
	b, err := os.ReadFile(l.recordPath())
	if errors.Is(err, os.ErrNotExist) {
		return &record{Originals: map[string]original{}, Written: map[string]string{}}, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	rec = &record{}
	if err := json.Unmarshal(b, rec); err != nil {
		return nil, false, fmt.Errorf("installer record %s: %w", l.recordPath(), err)
	}
	if rec.Originals == nil {
		rec.Originals = map[string]original{}
	}
	if rec.Written == nil {
		rec.Written = map[string]string{}
	}
	return rec, true, nil
}

// saveRecord writes the record durably: it must survive a power loss
// that the configuration it describes survives.
func (l Layout) saveRecord(rec *record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(l.recordPath()), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(l.recordPath(), b, atomicfile.Options{Perm: 0o600, Durability: atomicfile.SyncAll})
}

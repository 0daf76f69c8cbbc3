package shim

import "github.com/kvm-shim/containerd-shim-kvm-v1/config"

// Config is the shim's configuration (package config); the short names
// here serve the check preflight until it leaves this package.
type Config = config.Config

// DefaultConfigPath is config.DefaultPath.
const DefaultConfigPath = config.DefaultPath

// DefaultConfig returns config.Default.
func DefaultConfig() Config { return config.Default() }

// LoadConfig is config.Load.
func LoadConfig(path string) (Config, error) { return config.Load(path) }

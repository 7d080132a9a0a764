package cli

import "runtime/debug"

// version is set at link time: -ldflags "-X github.com/warmfleet/warmfleet/internal/cli.version=v1.2.3".
var version = ""

// Version reports the link-time version, else the module version, else "dev".
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

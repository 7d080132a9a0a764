package cli

import (
	"runtime/debug"
	"strings"
)

// version is set at link time: -ldflags "-X github.com/warmfleet/warmfleet/internal/cli.version=v1.2.3".
var version = ""

// Version reports the link-time version, else the module version, else "dev".
func Version() string {
	bi, _ := debug.ReadBuildInfo()
	return moduleVersion(version, bi)
}

// versionText is what `version` and --version print after the program's
// name: the version and the commit the binary was built from.
func versionText() string {
	bi, _ := debug.ReadBuildInfo()
	return describeBuild(version, bi)
}

// moduleVersion is linked, else the main module's version from the build
// info (a `go install ...@v1.2.3` binary has it), else "dev".
func moduleVersion(linked string, bi *debug.BuildInfo) string {
	if linked != "" {
		return linked
	}
	if bi != nil && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// describeBuild renders the version and, from the build info's VCS stamp
// (go build in a git checkout), the commit, its time and whether the tree
// had changes: "v1.2.3 (commit 0123456789ab, 2026-11-30T10:00:00Z, modified)".
func describeBuild(linked string, bi *debug.BuildInfo) string {
	v := moduleVersion(linked, bi)
	if bi == nil {
		return v
	}
	vcs := map[string]string{}
	for _, s := range bi.Settings {
		if k, ok := strings.CutPrefix(s.Key, "vcs."); ok {
			vcs[k] = s.Value
		}
	}
	commit := vcs["revision"]
	if commit == "" {
		return v + " (no VCS commit recorded: built outside a git checkout or with -buildvcs=false)"
	}
	parts := []string{"commit " + commit[:min(12, len(commit))]}
	if t := vcs["time"]; t != "" {
		parts = append(parts, t)
	}
	if vcs["modified"] == "true" {
		parts = append(parts, "modified")
	}
	return v + " (" + strings.Join(parts, ", ") + ")"
}

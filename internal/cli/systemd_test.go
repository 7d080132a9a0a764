package cli

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// unitDir holds the systemd units and their example environment files.
var unitDir = filepath.Join(testenv.RepoRoot(), "deploy", "systemd")

// unitKeys reads a unit file's Key=value lines (the last value of a key).
func unitKeys(t *testing.T, name string) (map[string]string, []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(unitDir, name))
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = v
		}
	}
	return keys, data
}

// systemdAnalyze runs `systemd-analyze verify` on unit, returning its
// output; a good unit gives none.
func systemdAnalyze(t *testing.T, unit string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "systemd-analyze", "verify", "--man=no", unit).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// TestSystemdUnitsVerify: systemd itself accepts both units, each a
// Type=notify service with a watchdog, an optional environment file and
// the hardening the README promises. verify checks that ExecStart's
// binary exists, so a copy runs this test binary instead.
func TestSystemdUnitsVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		testenv.Missing(t, "systemd-analyze not installed (apt-get install systemd)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe.service")
	if err := os.WriteFile(probe, []byte("[Service]\nType=oneshot\nExecStart="+self+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := systemdAnalyze(t, probe); err != nil || out != "" {
		testenv.Missing(t, "systemd-analyze verify cannot run on this machine: it rejects a minimal unit: %v: %s", err, out)
	}
	execStart := regexp.MustCompile(`(?m)^ExecStart=/usr/local/bin/warmfleet `)
	for name, want := range map[string]map[string]string{
		"warmfleet.service":        {"EnvironmentFile": "-/etc/warmfleet/warmfleet.env", "StateDirectory": "warmfleet", "RuntimeDirectory": "warmfleet"},
		"warmfleet-router.service": {"EnvironmentFile": "-/etc/warmfleet/router.env", "RuntimeDirectory": "warmfleet-router"},
	} {
		t.Run(name, func(t *testing.T) {
			keys, data := unitKeys(t, name)
			for k, v := range map[string]string{"Type": "notify", "ProtectSystem": "strict", "NoNewPrivileges": "yes",
				"PrivateTmp": "yes", "ProtectHome": "yes", "ReadWritePaths": "/etc/warmfleet", "CapabilityBoundingSet": ""} {
				want[k] = v
			}
			for k, v := range want {
				if got, ok := keys[k]; !ok || got != v {
					t.Errorf("%s=%q, want %q", k, got, v)
				}
			}
			if keys["WatchdogSec"] == "" {
				t.Error("no WatchdogSec")
			}
			if !execStart.Match(data) {
				t.Fatal("ExecStart does not run /usr/local/bin/warmfleet")
			}
			copyPath := filepath.Join(dir, name)
			if err := os.WriteFile(copyPath, execStart.ReplaceAll(data, []byte("ExecStart="+self+" ")), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := systemdAnalyze(t, copyPath); err != nil || out != "" {
				t.Fatalf("systemd-analyze verify %s: %v\n%s", name, err, out)
			}
		})
	}
}

// envFile reads an example environment file's WARMFLEET_* settings, the
// commented-out ones too: each must be a setting the command takes.
func envFile(t *testing.T, name string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(unitDir, name))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for line := range strings.Lines(string(data)) {
		line = strings.TrimPrefix(strings.TrimSpace(line), "#")
		if k, v, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, "WARMFLEET_") {
			vars[k] = v
		}
	}
	return vars
}

// TestSystemdEnvFilesTakeRealFlags: every WARMFLEET_ variable in the
// example environment files names a flag of its command, with a value it
// accepts, and the daemon's defaults live in the unit's own directories.
func TestSystemdEnvFilesTakeRealFlags(t *testing.T) {
	for _, tc := range []struct{ file, command string }{
		{"warmfleet.env", "daemon"}, {"warmfleet-router.env", "router"},
	} {
		vars := envFile(t, tc.file)
		if len(vars) == 0 {
			t.Fatalf("%s sets nothing", tc.file)
		}
		var help syncBuffer
		Run(t.Context(), []string{tc.command, "--help"}, &Env{Stdout: &help, Stderr: &help, Getenv: func(string) string { return "" }})
		for k := range vars {
			flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "WARMFLEET_"), "_", "-"))
			if !regexp.MustCompile(`(?m)^\s+(-\w, )?--` + regexp.QuoteMeta(flag) + `\b`).MatchString(help.String()) {
				t.Errorf("%s: %s is not a flag of warmfleet %s (--%s)", tc.file, k, tc.command, flag)
			}
		}
	}

	vars := envFile(t, "warmfleet.env")
	fs := newFlagSet(&Env{Stderr: &syncBuffer{}}, "daemon")
	var f daemonFlags
	f.register(fs)
	if err := parseFlags(fs, &Env{Getenv: func(k string) string { return vars[k] }}, nil, nil); err != nil {
		t.Fatalf("warmfleet.env: %v", err)
	}
	keys, _ := unitKeys(t, "warmfleet.service")
	if want := "/var/lib/" + keys["StateDirectory"]; f.dataDir != want {
		t.Errorf("data dir %s outside the unit's StateDirectory %s", f.dataDir, want)
	}
	if want := "unix:///run/" + keys["RuntimeDirectory"] + "/"; !strings.HasPrefix(defaultAPI, want) || !strings.HasPrefix(f.apiAddr, want) {
		t.Errorf("API %s (default %s) outside the unit's RuntimeDirectory %s", f.apiAddr, defaultAPI, want)
	}
}

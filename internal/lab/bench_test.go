package lab

import (
	"bytes"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/internal/cli"
)

// TestBenchBadFlags: every bench's bad flags end in a usage error (exit 2)
// that names them, before any work starts.
func TestBenchBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"s3", "--model-size", "lots"}, "model-size"},
		{[]string{"s3", "--model-size", "0"}, "--model-size 0"},
		{[]string{"s3", "--files", "0"}, "--files 0"},
		{[]string{"s3", "--runs", "0"}, "--runs 0"},
		{[]string{"s3", "--runs", "1000"}, "--runs 1000"},
		{[]string{"s3", "--read-runs", "0"}, "--read-runs 0"},
		{[]string{"s3", "--concurrency", "0"}, "--concurrency 0"},
		{[]string{"s3", "--part-size", "1KiB"}, "--part-size"},
		{[]string{"s3", "--methods", "daemon,ftp"}, `unknown method "ftp"`},
		{[]string{"s3", "--methods", "plain,plain"}, "given twice"},
		{[]string{"s3", "-o", "yaml"}, `-o "yaml"`},
		{[]string{"s3", "extra"}, "unexpected arguments"},
		{[]string{"fleet", "--host-procs", "-1"}, "--host-procs -1"},
		{[]string{"fleet", "--settle", "-1s"}, "--settle -1s"},
		{[]string{"fleet", "--settle", "soon"}, "settle"},
		{[]string{"fleet", "--mtu", "100"}, "--mtu 100"},
		{[]string{"fleet", "--origin", "hf", "--s3-keep-alive"}, "--s3-keep-alive applies to --origin s3"},
		{[]string{"fleet", "--plot", "/nonexistent-dir/fleet.svg"}, "directory does not exist"},
		{[]string{"fleet", "--plot", "fleet.png"}, "must end in .svg"},
		{[]string{"fleet", "-o", "yaml"}, `-o "yaml"`},
		{[]string{"chaos", "-o", "yaml"}, `-o "yaml"`},
		{[]string{"chaos", "--scenario", "meteor-strike"}, `no scenario "meteor-strike"`},
		{[]string{"chaos", "--timeout", "0s"}, "--timeout 0s"},
		{[]string{"chaos", "extra"}, "unexpected arguments"},
		{[]string{"chaos", "--vm-cuts", "-1"}, "--vm-cuts -1"},
		{[]string{"chaos", "--vm-cuts", "many"}, "vm-cuts"},
		{[]string{"s3", "--pause", "-1s"}, "--pause -1s"},
		{[]string{"router", "--overhead-duration", "-1s"}, "overhead rate"},
		{[]string{"router", "--trace-offset", "-5"}, "trace offset"},
		{[]string{"router", "--prompt-bytes", "0"}, "decision backends"},
		{[]string{"router", "--load", "NaN"}, "load in (0, 100]"},
		{[]string{"router", "--load-factor", "NaN"}, "load_factor NaN"},
		{[]string{"router", "--slack", "-1"}, "slack -1"},
		{[]string{"router", "--kv-blocks", "0"}, "kv-blocks"},
		{[]string{"router", "--plot", "/nonexistent-dir/ttft.svg"}, "directory does not exist"},
		{[]string{"router", "--plot", "ttft.png"}, "must end in .svg"},
		{[]string{"router", "--scale-out", "everything"}, "scale-out workload"},
		{[]string{"router", "--scale-out-add", "0"}, "scale-out workload"},
		{[]string{"router", "--strategies", "prefix-aware,round-robin"}, `unknown strategy "round-robin"`},
		{[]string{"router", "--backend-speeds", "2,fast"}, `"fast" is not a number`},
		{[]string{"router", "--backends", "2", "--backend-speeds", "2,2,1"}, "3 backend speeds for 2 backends"},
		{[]string{"router", "--backends", "2", "--backend-speeds", "2,-1"}, "speed -1"},
		{[]string{"router", "--router-speeds"}, "only when they are given"},
	}
	for _, tt := range tests {
		args := append([]string{"bench"}, tt.args...)
		var stderr bytes.Buffer
		code := Run(t.Context(), args, &cli.Env{Stdout: &bytes.Buffer{}, Stderr: &stderr, Getenv: func(string) string { return "" }})
		if code != 2 || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", args, code, stderr.String(), tt.want)
		}
	}
}

// TestUploadOverLink: bench fleet warns when the daemons may upload faster
// than a host's link, whichever way the flag is spelled, and only then.
func TestUploadOverLink(t *testing.T) {
	for _, tc := range []struct {
		args []string
		link netlab.Rate
		warn bool
	}{
		{[]string{"--p2p-upload-limit=23MB"}, 100 * netlab.Mbit, true},
		{[]string{"--p2p-upload-limit=23MB"}, 200 * netlab.Mbit, false},
		{[]string{"-p2p-upload-limit", "23MB"}, 100 * netlab.Mbit, true},
		{[]string{"--p2p-upload-limit=23MB", "--p2p-upload-limit=11.5MB"}, 100 * netlab.Mbit, false},
		{[]string{"--p2p-upload-limit=0"}, 100 * netlab.Mbit, false},
		{[]string{"--p2p-download-limit=23MB"}, 100 * netlab.Mbit, false},
		{[]string{"--p2p-upload-limit=23MB"}, 0, false},
		{nil, 100 * netlab.Mbit, false},
	} {
		got := uploadOverLink(tc.args, tc.link)
		if (got != "") != tc.warn {
			t.Errorf("uploadOverLink(%q, %s) = %q, want a warning: %v", tc.args, tc.link, got, tc.warn)
		}
	}
}

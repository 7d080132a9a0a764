package integration

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
)

// binDir holds the warmfleet binary built for this test binary; it is set
// once in TestMain, before any test runs, and only read afterwards.
var binDir string

func TestMain(m *testing.M) {
	if netlabtest.Helper() != "" {
		os.Exit(m.Run())
	}
	os.Exit(netlabtest.RunWithTempDir(m, "warmfleet-integration-bin-", &binDir))
}

// helpers run inside a lab host when the test binary is re-executed there
// (netlabtest.HelperCommand); each writes its result to stdout.
func helpers() map[string]func(ctx context.Context) error {
	return map[string]func(context.Context) error{
		"s3list":   helperS3List,
		"crashlab": helperCrashLab,
		"s3get":    helperS3Get,
	}
}

// TestHelperProcess is not a test: it is the entry point of the test binary
// re-executed inside a host namespace.
func TestHelperProcess(t *testing.T) {
	name := netlabtest.Helper()
	if name == "" {
		t.Skip("entry point for helper processes run inside lab hosts")
	}
	run, ok := helpers()[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown helper %q\n", name)
		os.Exit(2)
	}
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

package lab

import (
	"bytes"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/internal/cli"
)

func TestDemo(t *testing.T) {
	var out, errOut bytes.Buffer
	code := Run(t.Context(), []string{"demo", "--model-size", "6MiB", "--files", "2"},
		&cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }})
	if code != 0 {
		t.Fatalf("demo exited %d: %s\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"verified", "time to ready", "bytes from S3",
		"12 requests over 2 servers; each document's questions stayed on one server"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

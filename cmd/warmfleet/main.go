// Command warmfleet keeps a GPU inference fleet warm: one binary for the node
// daemon, its client commands and the prefix-aware router. The demo and the
// benchmarks are in cmd/warmfleet-lab, so this binary links no test support
// (deps_test.go checks it).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/warmfleet/warmfleet/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.StdEnv())
	stop()
	os.Exit(code)
}

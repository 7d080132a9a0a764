// Command warmfleet-lab is warmfleet's lab: the demo, the benchmarks and the
// simulated inference server, plus every command of warmfleet itself (the
// benchmarks run this binary's daemon). Operators ship cmd/warmfleet.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/lab"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := lab.Run(ctx, os.Args[1:], cli.StdEnv())
	stop()
	os.Exit(code)
}

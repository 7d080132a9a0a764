// Command warmfleet keeps a GPU inference fleet warm: one binary for the node
// daemon, its client commands and the prefix-aware router. The demo and the
// benchmarks are in cmd/warmfleet-lab, so this binary links no test support
// (deps_test.go checks it).
package main

import (
	"github.com/warmfleet/warmfleet/internal/cli"
)

func main() { cli.Main(cli.Run) }

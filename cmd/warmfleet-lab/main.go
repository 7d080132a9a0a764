// Command warmfleet-lab is warmfleet's lab: the demo, the benchmarks and the
// simulated inference server, plus every command of warmfleet itself (the
// benchmarks run this binary's daemon). Operators ship cmd/warmfleet.
package main

import (
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/lab"
)

func main() { cli.Main(lab.Run) }

// Command guestagent runs inside the power-loss test's virtual machine (see
// integration/vm) as its last init step: the guest agent (package
// integration/vm/agent). It is built with CGO_ENABLED=0 so that it runs in
// an initramfs that holds nothing but busybox.
package main

import (
	"flag"
	"log"

	"github.com/warmfleet/warmfleet/integration/vm/agent"
)

func main() {
	listen := flag.String("listen", ":7001", "address to serve on")
	flag.Parse()
	log.Printf("guestagent: serving on %s", *listen)
	log.Fatal(agent.Serve(*listen))
}

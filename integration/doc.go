// Package integration holds the multi-host tests of warmfleet: several hosts,
// each a network namespace with its own address, data directory and daemon,
// joined by shaped links (see integration/netlab). The tests need root; without
// it they skip (or fail in CI, which runs as root).
package integration

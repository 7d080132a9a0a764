package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/warmfleet/warmfleet/daemon/api"
)

// runCacheVerify asks the daemon to re-hash a ready cache against the
// source's digests; damaged files are fetched again (the cache is not ready
// until then). It exits non-zero when damage was found.
func runCacheVerify(ctx context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "cache verify")
	var c clientFlags
	c.register(fs, true)
	name, err := oneName(fs, e, args, "cache verify")
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	res, err := cl.Verify(ctx, name)
	if err != nil {
		return err
	}
	if c.output == "json" {
		err = writeJSONOut(e.Stdout, res)
	} else {
		printVerify(e.Stdout, res)
	}
	if err == nil && res.Repairing {
		err = errors.New(name + ": damaged files found; they are being fetched again")
	}
	return err
}

func printVerify(w io.Writer, res api.VerifyResult) {
	fmt.Fprintf(w, "%s revision %s: %d of %d files verified intact\n", res.Name, res.RevisionID, res.Checked, res.Files)
	if res.LinkBroken {
		fmt.Fprintln(w, "  current link: missing or wrong")
	}
	for _, f := range res.Damaged {
		fmt.Fprintf(w, "  damaged: %s: %s\n", f.Path, f.Reason)
	}
	for _, f := range res.Unverifiable {
		fmt.Fprintf(w, "  not verifiable: %s: %s\n", f.Path, f.Reason)
	}
	for _, p := range res.SourceChanged {
		fmt.Fprintf(w, "  changed in the source since cached (the next resync fetches it): %s\n", p)
	}
	if res.Repairing {
		fmt.Fprintln(w, "repairing: the damaged files are being fetched again; the cache is not ready until then")
	}
}

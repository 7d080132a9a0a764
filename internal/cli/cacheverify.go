package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/daemon/api"
)

// cacheVerifyCommand asks the daemon to re-hash a ready cache against the
// source's digests; damaged files are fetched again (the cache is not ready
// until then). It exits non-zero when damage was found.
func cacheVerifyCommand(e *Env) *cobra.Command {
	return nameCommand("verify NAME", "model NAME", "re-hash a ready cache against the source's digests and repair damage",
		"  warmfleet cache verify llama\n  warmfleet cache verify llama -o json", true,
		func(ctx context.Context, c *clientFlags, cl *api.Client, name string) error {
			res, err := cl.Verify(ctx, name)
			if err != nil {
				return err
			}
			err = printOut(e.Stdout, c.output, res, func(w io.Writer, res api.VerifyResult) error {
				printVerify(w, res)
				return nil
			})
			if err == nil && res.Repairing {
				err = errors.New(name + ": damaged files found; they are being fetched again: follow it with `warmfleet cache status " + name + "`")
			}
			return err
		})
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

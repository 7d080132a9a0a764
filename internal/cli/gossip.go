package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
)

// gossipCommand groups the gossip administration commands.
func gossipCommand(e *Env) *cobra.Command {
	return group("gossip", "fleet gossip administration: keys list, install, use, remove",
		"  warmfleet gossip keys list",
		gossipKeysCommand(e))
}

// gossipKeysCommand rotates the cluster key fleet-wide through one daemon,
// which passes each operation to every member over encrypted gossip.
func gossipKeysCommand(e *Env) *cobra.Command {
	return group("keys", "rotate the cluster key fleet-wide: list, install, use, remove",
		`  warmfleet keygen --out new.key
  warmfleet gossip keys install --key-file new.key
  warmfleet gossip keys use --key-file new.key
  warmfleet gossip keys remove --key-file old.key`,
		listCommand(e, "list", "list the keys every member holds (the first is in use)",
			"  warmfleet gossip keys list\n  warmfleet gossip keys list -o json", (*api.Client).GossipKeys, printGossipKeys),
		gossipKeyOpCommand(e, api.GossipKeyInstall, "add a key to every member's keyring (not yet used to send)",
			"  warmfleet gossip keys install --key-file new.key"),
		gossipKeyOpCommand(e, api.GossipKeyUse, "make an installed key the one every member sends with",
			"  warmfleet gossip keys use --key-file new.key\n  warmfleet gossip keys use --fingerprint sha256:0123456789abcdef"),
		gossipKeyOpCommand(e, api.GossipKeyRemove, "remove a key no longer in use from every member's keyring",
			"  warmfleet gossip keys remove --key-file old.key\n  warmfleet gossip keys remove --fingerprint sha256:0123456789abcdef"),
	)
}

func gossipKeyOpCommand(e *Env, op, short, example string) *cobra.Command {
	var c clientFlags
	var keyFile string
	var fingerprint *string
	use := op + " --key-file FILE"
	if op != api.GossipKeyInstall {
		use = op + " (--key-file FILE | --fingerprint sha256:HEX)"
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Example: example, Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := gossipKeyRequest(op, keyFile, fingerprint)
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			res, err := cl.GossipKeyOp(cmd.Context(), req)
			if err != nil {
				return err
			}
			if err := printOut(e.Stdout, c.output, res, printGossipKeys); err != nil {
				return err
			}
			if res.Failed > 0 {
				return fmt.Errorf("%s failed on %d of %d members: repeat it once they are reachable", op, res.Failed, len(res.Members))
			}
			return nil
		},
	}
	c.register(cmd, true)
	cmd.Flags().StringVar(&keyFile, "key-file", "", "`FILE` holding the key (base64, as 'warmfleet keygen' writes it; mode 0600)")
	if op != api.GossipKeyInstall {
		fingerprint = cmd.Flags().String("fingerprint", "", "the key's `FINGERPRINT` (sha256:...), as 'gossip keys list' shows it, instead of --key-file")
	}
	return cmd
}

// gossipKeyRequest builds the API request: the key itself only for install,
// its fingerprint otherwise, so that use and remove send no key material.
func gossipKeyRequest(op, keyFile string, fingerprint *string) (api.GossipKeyRequest, error) {
	req := api.GossipKeyRequest{Op: op}
	fp := ""
	if fingerprint != nil {
		fp = *fingerprint
	}
	switch {
	case keyFile == "" && fp == "" && op == api.GossipKeyInstall:
		return req, usageError("give --key-file")
	case keyFile == "" && fp == "":
		return req, usageError("give --key-file or --fingerprint")
	case keyFile != "" && fp != "":
		return req, usageError("give --key-file or --fingerprint, not both")
	case fp != "":
		if !gossip.ValidFingerprint(fp) {
			return req, usageError("--fingerprint %q: want sha256:<16 hex digits>", fp)
		}
		req.Fingerprint = fp
		return req, nil
	}
	keys, err := gossip.LoadKeyFile(keyFile)
	if err != nil {
		return req, err
	}
	if len(keys) != 1 {
		return req, usageError("--key-file %s holds %d keys: give a file with the one key to %s", keyFile, len(keys), op)
	}
	if op == api.GossipKeyInstall {
		req.Key = gossip.EncodeKey(keys[0])
	} else {
		req.Fingerprint = gossip.Fingerprint(keys[0])
	}
	return req, nil
}

func printGossipKeys(w io.Writer, r api.GossipKeysResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tRESULT\tKEYS (first in use)")
	for _, m := range r.Members {
		result := "ok"
		if !m.OK {
			result = "FAILED: " + m.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.Node, result, orDash(strings.Join(m.Keys, " ")))
	}
	return tw.Flush()
}

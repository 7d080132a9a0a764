package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
)

// runGossip groups the gossip administration commands.
func runGossip(ctx context.Context, e *Env, args []string) error {
	return subcommand(ctx, e, "gossip", args, map[string]func(context.Context, *Env, []string) error{
		"keys": runGossipKeys,
	})
}

// runGossipKeys rotates the cluster key fleet-wide through one daemon, which
// passes each operation to every member over encrypted gossip:
//
//	warmfleet gossip keys install --key-file new.key
//	warmfleet gossip keys use --key-file new.key
//	warmfleet gossip keys remove --key-file old.key
func runGossipKeys(ctx context.Context, e *Env, args []string) error {
	return subcommand(ctx, e, "gossip keys", args, map[string]func(context.Context, *Env, []string) error{
		"list": runGossipKeysList,
		"install": func(ctx context.Context, e *Env, args []string) error {
			return runGossipKeyOp(ctx, e, api.GossipKeyInstall, args)
		},
		"use": func(ctx context.Context, e *Env, args []string) error {
			return runGossipKeyOp(ctx, e, api.GossipKeyUse, args)
		},
		"remove": func(ctx context.Context, e *Env, args []string) error {
			return runGossipKeyOp(ctx, e, api.GossipKeyRemove, args)
		},
	})
}

func runGossipKeysList(ctx context.Context, e *Env, args []string) error {
	return listCommand(ctx, e, "gossip keys list", args, (*api.Client).GossipKeys, printGossipKeys)
}

func runGossipKeyOp(ctx context.Context, e *Env, op string, args []string) error {
	name := "gossip keys " + op
	fs := newFlagSet(e, name)
	var c clientFlags
	c.register(fs, true)
	keyFile := fs.String("key-file", "", "file holding the key (base64, as written by `warmfleet keygen`; mode 0600)")
	var fingerprint *string
	if op != api.GossipKeyInstall {
		fingerprint = fs.String("fingerprint", "", "the key's fingerprint (sha256:...), as `gossip keys list` shows it, instead of --key-file")
	}
	if err := parseFlags(fs, e, args, nil); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	req, err := gossipKeyRequest(op, *keyFile, fingerprint)
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	res, err := cl.GossipKeyOp(ctx, req)
	if err != nil {
		return err
	}
	if c.output == "json" {
		if err := writeJSONOut(e.Stdout, res); err != nil {
			return err
		}
	} else if err := printGossipKeys(e.Stdout, res); err != nil {
		return err
	}
	if res.Failed > 0 {
		return fmt.Errorf("%s failed on %d of %d members: repeat it once they are reachable", op, res.Failed, len(res.Members))
	}
	return nil
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

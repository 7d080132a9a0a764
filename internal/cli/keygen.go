package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/warmfleet/warmfleet/gossip"
)

// runKeygen writes a new cluster key: base64 of 32 random bytes, the format
// of --cluster-key-file.
func runKeygen(_ context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "keygen")
	out := fs.String("out", "", "write the key to this file (mode 0600) instead of standard output")
	force := fs.Bool("force", false, "replace an existing --out file")
	if err := parseFlags(fs, e, args, nil); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments: %v", fs.Args())
	}
	key, err := gossip.GenerateKey()
	if err != nil {
		return err
	}
	line := gossip.EncodeKey(key) + "\n"
	if *out == "" {
		_, err := fmt.Fprint(e.Stdout, line)
		return err
	}
	if err := writeKeyFile(*out, [][]byte{key}, *force); err != nil {
		return err
	}
	fmt.Fprintf(e.Stderr, "wrote a new cluster key to %s\n", *out)
	return nil
}

// writeKeyFile writes the key so that it is never readable by others, not
// even for a moment, and never replaces a key by accident: losing a cluster
// key cuts a node off its fleet.
func writeKeyFile(path string, keys [][]byte, force bool) error {
	if !force {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists: refusing to overwrite a cluster key (use --force)", path)
		}
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintln(f, gossip.EncodeKey(keys[0])); err != nil {
			_ = f.Close()
			_ = os.Remove(path)
			return err
		}
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return err
		}
		return f.Close()
	}
	return gossip.WriteKeyFile(path, keys)
}

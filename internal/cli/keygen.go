package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/gossip"
)

// keygenCommand writes a new cluster key: base64 of 32 random bytes, the
// format of --cluster-key-file.
func keygenCommand(e *Env) *cobra.Command {
	var out string
	var force bool
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "write a new cluster key",
		Long: `Write a new cluster key (base64 of 32 random bytes) to standard output, or
with --out to a file of mode 0600, creating its directory (mode 0700) when
missing. Every daemon and router of a fleet takes the same key with
--cluster-key-file.`,
		Example: "  warmfleet keygen --out /etc/warmfleet/cluster.key\n  warmfleet keygen > cluster.key",
		Args:    noArgs,
		RunE: func(*cobra.Command, []string) error {
			key, err := gossip.GenerateKey()
			if err != nil {
				return err
			}
			if out == "" {
				_, err := fmt.Fprintln(e.Stdout, gossip.EncodeKey(key))
				return err
			}
			if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
				return fmt.Errorf("key directory: %w", err)
			}
			if err := writeKeyFile(out, [][]byte{key}, force); err != nil {
				return err
			}
			fmt.Fprintf(e.Stderr, "wrote a new cluster key to %s\n", out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "write the key to this file (mode 0600; its directory is created, mode 0700) instead of standard output")
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing --out file")
	return cmd
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

package cli

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/torrentorigin"
)

func torrentCommand(e *Env) *cobra.Command {
	return group("torrent", "BitTorrent: export a cached model as a .torrent",
		"  warmfleet torrent export llama --web-seed https://models.example.com/ --out llama.torrent",
		torrentExportCommand(e))
}

func torrentExportCommand(e *Env) *cobra.Command {
	var webSeeds listFlag
	var out string
	var pieceLength byteSize
	cmd := nameCommand("export MODEL --web-seed URL --out FILE", "model MODEL",
		"write a v1 .torrent of the ready revision cached on this node, with web seeds, for any BitTorrent client",
		"  warmfleet torrent export llama --web-seed https://models.example.com/ --out llama.torrent", false,
		func(ctx context.Context, _ *clientFlags, cl *api.Client, name string) error {
			if len(webSeeds) == 0 || out == "" {
				return usageError("--web-seed and --out are required")
			}
			st, err := cl.Cache(ctx, name)
			if err != nil {
				return err
			}
			if !st.Ready || st.Path == "" {
				return fmt.Errorf("model %s is not ready on this node (state %s): export reads the local copy", name, st.State)
			}
			paths, err := revisionFiles(st.Path)
			if err != nil {
				return err
			}
			tname := torrentName(name)
			mi, err := torrentorigin.Export(ctx, st.Path, paths, torrentorigin.ExportOptions{
				Name: tname, WebSeeds: webSeeds, PieceLength: int64(pieceLength), CreatedBy: "warmfleet " + Version(),
			})
			if err != nil {
				return err
			}
			var buf bytes.Buffer
			if err := mi.Write(&buf); err != nil {
				return err
			}
			if err := writeFileAtomic(out, buf.Bytes()); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "%s: %d files, info hash %s; serve %s as <web seed>%s/\n", out, len(paths), mi.HashInfoBytes().HexString(), st.Path, tname)
			return nil
		})
	fs := cmd.Flags()
	fs.Var(&webSeeds, "web-seed", "BEP 19 web seed URL ending in '/': file PATH is fetched from URL + NAME/PATH, NAME being the model name with '/' as '--' (repeatable)")
	fs.StringVar(&out, "out", "", "the .torrent file to write")
	fs.Var(&pieceLength, "piece-length", "piece size, e.g. 4MiB (default: a power of two from 256KiB to 16MiB making at most ~2000 pieces)")
	return cmd
}

// torrentName is a model name as a torrent's top folder: "org/model"
// becomes "org--model", as the Hub's cache names it.
func torrentName(model string) string { return strings.ReplaceAll(model, "/", "--") }

// revisionFiles lists the files of a published revision in the order of
// BEP 52's file tree: paths compared name by name ("a/b" before "a.b",
// where a plain string sort, as S3 lists keys, puts it after). v1 sets no
// order, but a fixed one makes every node's export of a revision the same
// info hash, and this one is what hybrid v1+v2 creators and a directory
// walk produce.
func revisionFiles(dir string) ([]string, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		paths = append(paths, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the revision's files: %w", err)
	}
	slices.SortFunc(paths, func(a, b string) int {
		return slices.Compare(strings.Split(a, "/"), strings.Split(b, "/"))
	})
	return paths, nil
}

// writeFileAtomic writes b to name through a temporary file beside it.
func writeFileAtomic(name string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".warmfleet-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}

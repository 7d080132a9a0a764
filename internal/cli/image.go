package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/spec"
)

// defaultImageOwner is the owner of images added without --owner.
const defaultImageOwner = "default"

func runImage(ctx context.Context, e *Env, args []string) error {
	return subcommand(ctx, e, "image", args, map[string]func(context.Context, *Env, []string) error{
		"add": runImageAdd,
		"ls":  runImageList,
		"rm":  runImageRemove,
	})
}

// oneRef parses flags around a single image REF argument.
func oneRef(fs *flagSet, e *Env, args []string, what string) (string, error) {
	return oneArg(fs, e, args, what, "image REF")
}

func runImageAdd(ctx context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "image add")
	var c clientFlags
	c.register(fs, false)
	owner := fs.String("owner", defaultImageOwner, "deployment that wants the image; the image stays while any owner does")
	var selector listFlag
	fs.Var(&selector, "selector", "only nodes with this label k=v (repeatable)")
	nodes := fs.Int("nodes", 0, "only this many of the eligible nodes (0 = all)")
	ref, err := oneRef(fs, e, args, "image add")
	if err != nil {
		return err
	}
	sel, err := spec.ParseLabels(selector)
	if err != nil {
		return usageError("--selector: %v", err)
	}
	req := api.AddImageRequest{Ref: ref, Owner: *owner, Targets: spec.Targets{Selector: sel, Nodes: *nodes}}
	if err := req.Spec().Validate(); err != nil {
		return usageError("%v", err)
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if err := cl.AddImage(ctx, req); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "image %s wanted by %s; pre-pull runs on the target nodes (warmfleet image ls)\n", ref, *owner)
	return nil
}

func runImageList(ctx context.Context, e *Env, args []string) error {
	return listCommand(ctx, e, "image ls", args, (*api.Client).Images, printImages)
}

func printImages(w io.Writer, all []api.ImageStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REF\tSTATE\tPROGRESS\tSIZE\tMANAGED\tOWNERS\tDIGEST\tERROR")
	for _, im := range all {
		progress := "-"
		if im.BytesTotal > 0 {
			progress = fmt.Sprintf("%.0f%%", 100*float64(im.BytesDone)/float64(im.BytesTotal))
		}
		digest := im.Digest
		if len(digest) > 19 {
			digest = digest[:19]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\n", im.Ref, im.State, progress, bytesize.Format(im.Size), im.Managed,
			orDash(strings.Join(im.Owners, ",")), orDash(digest), im.Error)
	}
	return tw.Flush()
}

func runImageRemove(ctx context.Context, e *Env, args []string) error {
	fs := newFlagSet(e, "image rm")
	var c clientFlags
	c.register(fs, false)
	owner := fs.String("owner", defaultImageOwner, "owner whose claim to drop")
	ref, err := oneRef(fs, e, args, "image rm")
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if err := cl.RemoveImage(ctx, ref, *owner); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "%s released by %s; removed from nodes where no other owner or container uses it\n", ref, *owner)
	return nil
}

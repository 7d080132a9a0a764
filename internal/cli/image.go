package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/spec"
)

// defaultImageOwner is the owner of images added without --owner.
const defaultImageOwner = "default"

func imageCommand(e *Env) *cobra.Command {
	return group("image", "manage container image caches: add, ls, rm",
		"  warmfleet image add nginx:1.27 --owner web\n  warmfleet image ls",
		imageAddCommand(e), imageListCommand(e), imageRemoveCommand(e))
}

// imageClaimCommand is `image add` or `image rm`: a claim of --owner on
// one image REF, with the targets when adding.
func imageClaimCommand(e *Env, use, short, example, ownerHelp string, adding bool, run func(ctx context.Context, cl *api.Client, req api.AddImageRequest) error) *cobra.Command {
	var c clientFlags
	var owner string
	var selector listFlag
	var nodes int
	cmd := &cobra.Command{
		Use: use, Short: short, Example: example, Args: exactArgs("image REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := spec.ParseLabels(selector)
			if err != nil {
				return usageError("--selector: %v", err)
			}
			req := api.AddImageRequest{Ref: args[0], Owner: owner, Targets: spec.Targets{Selector: sel, Nodes: nodes}}
			if adding {
				if err := req.Spec().Validate(); err != nil {
					return usageError("%v", err)
				}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			return run(cmd.Context(), cl, req)
		},
	}
	c.register(cmd, false)
	fs := cmd.Flags()
	fs.StringVar(&owner, "owner", defaultImageOwner, ownerHelp)
	if adding {
		fs.Var(&selector, "selector", "only nodes with this label k=v (repeatable)")
		fs.IntVar(&nodes, "nodes", 0, "only this many of the eligible nodes (0 = all)")
	}
	return cmd
}

func imageAddCommand(e *Env) *cobra.Command {
	return imageClaimCommand(e, "add REF", "pre-pull a container image on the nodes its targets select",
		"  warmfleet image add vllm/vllm-openai:v0.6.3 --owner llama\n  warmfleet image add nginx:1.27 --selector gpu=h100",
		"deployment that wants the image; the image stays while any owner does", true,
		func(ctx context.Context, cl *api.Client, req api.AddImageRequest) error {
			if err := cl.AddImage(ctx, req); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "image %s wanted by %s; pre-pull runs on the target nodes (warmfleet image ls)\n", req.Ref, req.Owner)
			return nil
		})
}

func imageListCommand(e *Env) *cobra.Command {
	return listCommand(e, "ls", "list this node's images: pre-pulls and what containerd holds",
		"  warmfleet image ls\n  warmfleet image ls -o yaml", (*api.Client).Images, printImages)
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

func imageRemoveCommand(e *Env) *cobra.Command {
	return imageClaimCommand(e, "rm REF", "drop an owner's claim on an image",
		"  warmfleet image rm nginx:1.27 --owner web", "owner whose claim to drop", false,
		func(ctx context.Context, cl *api.Client, req api.AddImageRequest) error {
			if err := cl.RemoveImage(ctx, req.Ref, req.Owner); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "%s released by %s; removed from nodes where no other owner or container uses it\n", req.Ref, req.Owner)
			return nil
		})
}

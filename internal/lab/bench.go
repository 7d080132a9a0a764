package lab

import (
	"context"

	"github.com/warmfleet/warmfleet/internal/cli"
)

func runBench(ctx context.Context, e *cli.Env, args []string) error {
	return cli.Subcommand(ctx, e, "bench", args, map[string]func(context.Context, *cli.Env, []string) error{
		"s3":     runBenchS3,
		"fleet":  runBenchFleet,
		"router": runBenchRouter,
		"chaos":  runBenchChaos,
	})
}

package cli

import "context"

func runBench(ctx context.Context, e *Env, args []string) error {
	return subcommand(ctx, e, "bench", args, map[string]func(context.Context, *Env, []string) error{
		"s3":     runBenchS3,
		"fleet":  runBenchFleet,
		"router": runBenchRouter,
	})
}

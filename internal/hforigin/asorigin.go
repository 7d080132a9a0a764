package hforigin

import (
	"context"
	"fmt"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// List takes the source as the spec writes it
// (hf://org/model[@revision][/subdir]); see ListHF.
func (c *Client) List(ctx context.Context, source string) ([]s3origin.Object, error) {
	src, err := spec.ParseHFURL(source)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", source, err)
	}
	return c.ListHF(ctx, src)
}

var _ origin.Origin = (*Client)(nil)

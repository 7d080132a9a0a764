package s3origin

import (
	"context"
	"fmt"

	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// AsOrigin is c as an origin.Origin, the interface the daemon fetches
// through: List takes the source as the spec writes it (s3://bucket/prefix/)
// and NewRangeCheck answers with an interface.
func AsOrigin(c *Client) origin.Origin { return asOrigin{c} }

type asOrigin struct{ *Client }

func (o asOrigin) List(ctx context.Context, source string) ([]Object, error) {
	src, err := spec.ParseS3URL(source)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", source, err)
	}
	return o.Client.List(ctx, src)
}

// NewRangeCheck returns a nil interface, not a typed nil, when the object's
// digest is no CRC: callers test the answer against nil.
func (o asOrigin) NewRangeCheck(ctx context.Context, obj Object) (origin.RangeCheck, error) {
	rc, err := o.Client.NewRangeCheck(ctx, obj)
	if rc == nil {
		return nil, err
	}
	return rc, err
}

package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"

	imagecache "github.com/warmfleet/warmfleet/containerd"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/desired"
	"github.com/warmfleet/warmfleet/internal/manifest"
	"github.com/warmfleet/warmfleet/spec"
)

// ErrBadApply marks an apply request that is wrong in itself (an invalid
// owner, spec or endpoint, a key named twice): the caller's mistake.
var ErrBadApply = errors.New("bad apply request")

// Apply plans req against what this daemon holds (the fleet's desired
// specs, this node's endpoints) with the rules of package manifest
// (MakePlan, or PlanDelete when req.Delete) and, unless req.DryRun,
// carries the plan out. Another owner's objects make it fail with a
// *manifest.ConflictError and change nothing. Applies on
// one node run one at a time, so two sources cannot interleave their
// plans here; applies on two nodes at once meet in the desired state,
// where the later write of a key wins.
func (d *Daemon) Apply(ctx context.Context, req api.ApplyRequest) (api.ApplyResult, error) {
	want, err := d.applyObjects(req)
	if err != nil {
		return api.ApplyResult{}, err
	}
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	eps, err := d.state.endpoints()
	if err != nil {
		return api.ApplyResult{}, err
	}
	held := make([]manifest.Current, 0, len(eps))
	for _, s := range d.desired.List() {
		held = append(held, manifest.Held(s))
	}
	for _, ep := range eps {
		held = append(held, manifest.HeldEndpoint(ep))
	}
	var plan manifest.Plan
	if req.Delete {
		plan, err = manifest.PlanDelete(held, want, req.Owner)
	} else {
		plan, err = manifest.MakePlan(held, want, req.Owner, req.Prune)
	}
	if err != nil {
		return api.ApplyResult{}, err
	}
	res := api.ApplyResult{Owner: req.Owner, DryRun: req.DryRun, Unchanged: plan.Unchanged, Missing: plan.Missing}
	var b strings.Builder
	if err := plan.Diff(&b); err != nil {
		return api.ApplyResult{}, err
	}
	res.Diff = b.String()
	for _, c := range plan.Changes {
		res.Changes = append(res.Changes, api.ApplyChange{Action: string(c.Action), Key: c.Key})
	}
	if req.DryRun || plan.Empty() {
		return res, nil
	}
	if err := d.carryOut(ctx, plan); err != nil {
		return api.ApplyResult{}, err
	}
	verb := "applied"
	if req.Delete {
		verb = "deleted"
	}
	d.log.Info(verb, "owner", req.Owner, "changes", len(plan.Changes), "unchanged", plan.Unchanged)
	return res, nil
}

// applyObjects checks a request from outside and turns it into the
// objects a plan compares. Image references are normalized as AddImage
// does, so a file's "nginx" meets the stored "docker.io/library/nginx:latest".
func (d *Daemon) applyObjects(req api.ApplyRequest) ([]manifest.Object, error) {
	if err := manifest.ValidateOwner(req.Owner); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadApply, err)
	}
	if req.Delete && req.Prune {
		return nil, fmt.Errorf("%w: delete and prune: a delete removes what it names, a prune what it does not; ask one", ErrBadApply)
	}
	if n := len(req.Specs) + len(req.Endpoints); n > manifest.MaxDocuments {
		return nil, fmt.Errorf("%w: %d objects, at most %d", ErrBadApply, n, manifest.MaxDocuments)
	}
	var (
		objs []manifest.Object
		errs []error
	)
	seen := map[string]bool{}
	add := func(o manifest.Object, applied string) {
		if applied != "" && applied != req.Owner {
			errs = append(errs, fmt.Errorf("%s: applied_by %q is not the request's owner", o.Key(), applied))
			return
		}
		if seen[o.Key()] {
			errs = append(errs, fmt.Errorf("%s: named twice", o.Key()))
			return
		}
		seen[o.Key()] = true
		objs = append(objs, o)
	}
	for _, s := range req.Specs {
		applied := s.AppliedBy
		s.AppliedBy = ""
		if s.Kind == spec.KindImage {
			ref, err := imagecache.NormalizeRef(s.Name)
			if err == nil {
				s.Name = ref
				err = imagecache.ValidateOwner(s.Owner)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("image %s: %w", s.Name, err))
				continue
			}
		}
		if err := s.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Key(), err))
			continue
		}
		add(manifest.FromSpec(s), applied)
	}
	for _, ep := range req.Endpoints {
		applied := ep.AppliedBy
		ep.AppliedBy = ""
		if err := ep.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %s: %w", ep.URL, err))
			continue
		}
		add(manifest.FromEndpoint(ep), applied)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadApply, err)
	}
	return objs, nil
}

// carryOut makes the plan's changes, stopping at the first that fails:
// what went before it stays, and applying again finishes the rest.
func (d *Daemon) carryOut(ctx context.Context, plan manifest.Plan) error {
	defer d.Kick()
	defer d.publishInventory()
	for _, c := range plan.Changes {
		var err error
		switch {
		case c.Action == manifest.Delete && c.Old.Kind == manifest.KindEndpoint:
			_, err = d.state.deleteEndpoint(c.Old.Endpoint.URL)
		case c.Action == manifest.Delete:
			if err = d.desired.Delete(ctx, c.Key); errors.Is(err, desired.ErrNotFound) {
				err = nil // deleted meanwhile: what was asked holds
			}
		case c.New.Kind == manifest.KindEndpoint:
			ep := c.New.Endpoint
			ep.AppliedBy = plan.Owner
			err = d.state.putEndpoint(ep)
		default:
			s := c.New.Spec
			s.AppliedBy = plan.Owner
			err = d.desired.Put(ctx, s)
		}
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", c.Action, c.Key, err)
		}
	}
	return nil
}

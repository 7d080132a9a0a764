package router

import (
	"context"
	"errors"

	"github.com/warmfleet/warmfleet/router/balance"
)

// Route is a routing decision made without sending the request.
type Route struct {
	Backend string
	Reason  balance.Reason
	Matched int // blocks expected cached on Backend
	Blocks  int // blocks in the prompt
}

// Route decides where an inference body would go, exactly as ServeHTTP does
// (scan, hash, decide, record in the index) but without sending it; the
// reserved slot is released at once. For benchmarks and dry runs.
func (rt *Router) Route(ctx context.Context, body []byte, session string) (Route, error) {
	cfg := rt.Config()
	model, kp, _, exact, sess, err := rt.scanKeys(&cfg, body, session)
	if err != nil {
		return Route{}, err
	}
	if model == "" {
		return Route{}, errors.New("missing model")
	}
	defer rt.putKeys(kp)
	got, err := rt.acquire(ctx, &routeRequest{model: model, keys: *kp, exact: exact, strategy: cfg.StrategyFor(model), session: sess})
	if err != nil {
		return Route{}, err
	}
	rt.release(&got)
	return Route{Backend: got.b.url, Reason: got.decision.Reason, Matched: got.decision.Matched, Blocks: got.blocks}, nil
}

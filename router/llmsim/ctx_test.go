package llmsim

import (
	"context"
	"net/http"
)

func contextWithCancel(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithCancel(r.Context())
}

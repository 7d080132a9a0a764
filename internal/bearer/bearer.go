// Package bearer guards an HTTP API with a static bearer token, the way
// the daemon's API (--api-token-file) and the router's admin listener
// (--admin-token-file) do: every request must carry
// "Authorization: Bearer TOKEN", compared in constant time.
package bearer

import (
	"crypto/subtle"
	"net/http"
)

// Require returns next guarded by token; an empty token guards nothing.
// A request without the right token gets deny instead.
func Require(token string, next http.Handler, deny func(http.ResponseWriter)) http.Handler {
	if token == "" {
		return next
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			deny(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

package bearer

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestRequire: only the exact "Bearer TOKEN" header reaches next; anything
// else gets deny, and an empty token guards nothing.
func TestRequire(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	deny := func(w http.ResponseWriter) { w.WriteHeader(http.StatusUnauthorized) }
	const token = "s3cret-token"
	for _, tc := range []struct {
		name, token, header string
		want                int
	}{
		{"right token", token, "Bearer " + token, http.StatusNoContent},
		{"no header", token, "", http.StatusUnauthorized},
		{"wrong token", token, "Bearer s3cret-tokem", http.StatusUnauthorized},
		{"token's prefix", token, "Bearer s3cret", http.StatusUnauthorized},
		{"token and more", token, "Bearer " + token + "x", http.StatusUnauthorized},
		{"other scheme", token, "Basic " + token, http.StatusUnauthorized},
		{"bare token", token, token, http.StatusUnauthorized},
		{"empty token guards nothing", "", "", http.StatusNoContent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodGet, "/x", nil)
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			Require(tc.token, next, deny).ServeHTTP(rec, r)
			if rec.Code != tc.want {
				t.Fatalf("Authorization %q: status %d, want %d", tc.header, rec.Code, tc.want)
			}
		})
	}
}

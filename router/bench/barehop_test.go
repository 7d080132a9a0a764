package bench

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestBareHop: the baseline proxy passes each body through whole, takes
// the backends in turn, and hands back what the backend answered.
func TestBareHop(t *testing.T) {
	const backends = 3
	var urls []string
	for i := range backends {
		u, stop, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("backend %d: read the body: %v", i, err)
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "%d:%s %d", i, r.URL.Path, len(b))
		}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		urls = append(urls, u)
	}
	hop, stop, err := serveBareHop(urls)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	body := strings.Repeat("x", 100_000) // larger than any buffer on the way
	seen := map[string]int{}
	for range 2 * backends {
		res, err := http.Post(hop+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusCreated {
			t.Fatalf("status %d, %q, %v", res.StatusCode, got, err)
		}
		seen[string(got)]++
	}
	for i := range backends {
		if want := fmt.Sprintf("%d:/v1/completions %d", i, len(body)); seen[want] != 2 {
			t.Errorf("answers %v: want %q twice", seen, want)
		}
	}
	if _, _, err := serveBareHop([]string{"http://[::1"}); err == nil {
		t.Error("a backend URL that does not parse was taken")
	}
}

package hforigin

import (
	"net/url"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/spec"
)

// FuzzAPIAnswers feeds arbitrary bytes to the decoders of the Hub's API
// answers and arbitrary Link headers to the pagination: they must return
// an error or objects with safe paths under the subdir, never panic.
func FuzzAPIAnswers(f *testing.F) {
	blob, sha := strings.Repeat("a", 40), strings.Repeat("b", 64)
	f.Add([]byte(`{"id":"org/m","sha":"`+blob+`","siblings":[]}`), `<https://hub/api/models/o/m/tree/x?cursor=2>; rel="next"`)
	f.Add([]byte(`[{"type":"directory","oid":"`+blob+`","size":0,"path":"sub"},{"type":"file","oid":"`+blob+`","size":3,"path":"sub/a.json"},`+
		`{"type":"file","oid":"`+blob+`","size":9,"path":"sub/w.bin","lfs":{"oid":"`+sha+`","size":9,"pointerSize":130}}]`), "")
	f.Add([]byte(`[{"type":"file","oid":"`+blob+`","size":1,"path":"sub/../../x"}]`), `<//evil/x>; rel="next"`)
	f.Add([]byte(`[] []`), `<x>; rel=next, <y>; rel="next"`)
	f.Add([]byte(`[{"type":"file","size":1e400,"path":"sub/a"}]`), `bad`)
	src := spec.HFURL{Repo: "org/m", Revision: "main", Subdir: "sub"}
	c, err := New(Options{Endpoint: "https://hub"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, link string) {
		if commit, err := decodeModelInfo(body); err == nil && !commitRE.MatchString(commit) {
			t.Fatalf("model info gave commit %q", commit)
		}
		if next, err := c.nextPage("https://hub/api/models/o/m/tree/x", []string{link}); err == nil && next != "" {
			if u, err := url.Parse(next); err != nil || u.Host != "hub" {
				t.Fatalf("next page %q leaves the Hub", next)
			}
		}
		entries, err := decodeTreePage(body, 0, MaxFiles)
		if err != nil {
			return
		}
		objs, err := objectsFromTree(src, blob, entries, []string{"*.json", "w*"}, nil)
		if err != nil {
			return
		}
		for _, o := range objs {
			if s3origin.ValidRelPath(o.Path) != nil || o.Key != "sub/"+o.Path || checkObject(o) != nil {
				t.Fatalf("unsafe object %+v", o)
			}
		}
	})
}

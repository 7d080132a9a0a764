package daemon

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// TestApplyAPIBadRequests: an apply request that is wrong in itself is a
// 400 that changes nothing; another owner's object is a 409 naming it;
// applied_by is apply's alone.
func TestApplyAPIBadRequests(t *testing.T) {
	d := newDaemon(t, t.TempDir(), nil)
	t.Cleanup(func() { d.Close() })
	srv := httptest.NewServer(d.Handler(""))
	defer srv.Close()
	const model = `{"kind":"model","name":"m","source":"s3://bkt/m/"}`
	for _, tt := range []struct {
		name, method, path, body string
		code                     int
		contains                 string
	}{
		{"no owner", "POST", "/v1/apply", `{"specs":[` + model + `]}`, 400, "owner"},
		{"owner with a newline", "POST", "/v1/apply", `{"owner":"a\nb","specs":[` + model + `]}`, 400, "printable"},
		{"unknown field", "POST", "/v1/apply", `{"owner":"o","prnue":true}`, 400, "unknown field"},
		{"invalid spec", "POST", "/v1/apply", `{"owner":"o","specs":[{"kind":"model","name":"../m","source":"s3://bkt/m/"}]}`, 400, "model name"},
		{"named twice", "POST", "/v1/apply", `{"owner":"o","specs":[` + model + `,` + model + `]}`, 400, "named twice"},
		{"someone else's applied_by", "POST", "/v1/apply", `{"owner":"o","specs":[{"kind":"model","name":"m","source":"s3://bkt/m/","applied_by":"p"}]}`, 400, "not the request's owner"},
		{"bad image", "POST", "/v1/apply", `{"owner":"o","specs":[{"kind":"image","name":"UPPER","owner":"x"}]}`, 400, "image"},
		{"bad endpoint", "POST", "/v1/apply", `{"owner":"o","endpoints":[{"model":"m","url":"ftp://x"}]}`, 400, "http://"},
		{"oversize", "POST", "/v1/apply", `{"owner":"` + strings.Repeat("a", maxApplyBytes) + `"}`, 400, "larger than"},
		{"nothing applied by the bad ones", "GET", "/v1/caches", "", 200, "[]"},
		{"dry run", "POST", "/v1/apply", `{"owner":"o","dry_run":true,"specs":[` + model + `]}`, 200, "1 to create"},
		{"nothing applied by the dry run", "GET", "/v1/caches", "", 200, "[]"},
		{"apply", "POST", "/v1/apply", `{"owner":"o","specs":[` + model + `]}`, 200, `"action": "create"`},
		{"another owner", "POST", "/v1/apply", `{"owner":"p","specs":[` + model + `]}`, 409, "model/m (owner o)"},
		{"delete with prune", "POST", "/v1/apply", `{"owner":"o","delete":true,"prune":true}`, 400, "delete and prune"},
		{"delete of another owner's", "POST", "/v1/apply", `{"owner":"p","delete":true,"specs":[` + model + `]}`, 409, "delete: 1 object(s) belong to another owner"},
		{"delete dry run", "POST", "/v1/apply", `{"owner":"o","delete":true,"dry_run":true,"specs":[` + model + `]}`, 200, "1 to delete"},
		{"nothing deleted by the dry run", "GET", "/v1/caches", "", 200, `"name": "m"`},
		{"delete", "POST", "/v1/apply", `{"owner":"o","delete":true,"specs":[` + model + `]}`, 200, `"action": "delete"`},
		{"deleted", "GET", "/v1/caches", "", 200, "[]"},
		{"endpoint by hand with applied_by", "POST", "/v1/endpoints", `{"model":"m","url":"http://127.0.0.1:1","applied_by":"o"}`, 400, "apply only"},
		{"apply dir off", "GET", "/v1/apply-dir", "", 200, "{}"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, body := httpDo(t, tt.method, srv.URL+tt.path, tt.body, "")
			if code != tt.code || !strings.Contains(body, tt.contains) {
				t.Fatalf("%s %s = %d %q, want %d containing %q", tt.method, tt.path, code, body, tt.code, tt.contains)
			}
		})
	}
}

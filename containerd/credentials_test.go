package imagecache

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// helperScript is a docker credential helper in sh: "get" reads the server
// URL on stdin, logs it to the file named by $0.log, and answers with
// what answer prints for it.
const helperScript = `#!/bin/sh
[ "$1" = get ] || { echo "unsupported action $1" >&2; exit 1; }
read -r url
echo "$url" >> "$0.log"
%s
`

// installHelpers writes docker-credential-<name> executables (each the
// helperScript around its answer) into a fresh directory put first in
// PATH, and returns the directory.
func installHelpers(t *testing.T, answers map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, answer := range answers {
		script := strings.Replace(helperScript, "%s", answer, 1)
		if err := os.WriteFile(filepath.Join(dir, helperPrefix+name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return dir
}

// helperAsked returns the server URLs helper name was asked about.
func helperAsked(t *testing.T, dir, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, helperPrefix+name+".log"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// testHelpers answer as real helpers do, and as broken ones do.
var testHelpers = map[string]string{
	"good":     `printf '{"ServerURL":"%s","Username":"helper-user","Secret":"helper-pass"}\n' "$url"`,
	"store":    `printf '{"ServerURL":"%s","Username":"store-user","Secret":"store-pass"}\n' "$url"`,
	"token":    `printf '{"ServerURL":"%s","Username":"<token>","Secret":"refresh"}\n' "$url"`,
	"notfound": `echo "credentials not found in native keychain"; exit 1`,
	"garbage":  `echo "this is not json"`,
	"failing":  `echo "keychain locked" >&2; exit 3`,
	"hang":     `exec sleep 600`,
	"huge":     `head -c 2000000 /dev/zero`,
	// Stands in for amazon-ecr-credential-helper, should the machine have it.
	"ecr-login": `printf '{"ServerURL":"%s","Username":"AWS","Secret":"from-helper"}\n' "$url"`,
}

func TestCredentialsChain(t *testing.T) {
	helpers := installHelpers(t, testHelpers)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	storeCfg := filepath.Join(dir, "store.json")
	write := func(path, data string) {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(cfg, `{
		"auths": {
			"reg.example.com": {"auth": "`+base64.StdEncoding.EncodeToString([]byte("u:p"))+`"},
			"111111111111.dkr.ecr.us-west-2.amazonaws.com": {"username": "AWS", "password": "static"},
			"helped.example.com": {"username": "from-auths", "password": "x"}
		},
		"credHelpers": {
			"222222222222.dkr.ecr.us-west-2.amazonaws.com": "ecr-login",
			"444444444444.dkr.ecr.us-west-2.amazonaws.com": "notfound",
			"gcr.io": "absent",
			"helped.example.com": "good",
			"https://index.docker.io/v1/": "good",
			"token.example.com": "token",
			"notfound.example.com": "notfound",
			"garbage.example.com": "garbage",
			"failing.example.com": "failing",
			"hang.example.com": "hang",
			"huge.example.com": "huge"
		}}`)
	// With a credsStore, every host without its own helper asks the store,
	// and "auths" entries no longer answer (as for the docker CLI).
	write(storeCfg, `{
		"auths": {"reg.example.com": {"username": "ignored", "password": "x"}},
		"credHelpers": {"helped.example.com": "good"},
		"credsStore": "store"}`)
	fake := &fakeECR{token: "from-ecr", expires: time.Now().Add(12 * time.Hour)}
	tokens := newECRTokens(time.Now)
	tokens.newClient = func(context.Context, string) (ecrAPI, error) { return fake, nil }

	for _, tc := range []struct {
		name      string
		dockerCfg string
		ecr       *ecrTokens
		host      string
		want      Credential
		err       string
	}{
		{"config.json entry", cfg, tokens, "reg.example.com", Credential{"u", "p"}, ""},
		{"helper over an auths entry", cfg, tokens, "helped.example.com", Credential{"helper-user", "helper-pass"}, ""},
		{"helper for Docker Hub", cfg, tokens, "registry-1.docker.io", Credential{"helper-user", "helper-pass"}, ""},
		{"helper identity token", cfg, tokens, "token.example.com", Credential{Secret: "refresh"}, ""},
		{"helper has none", cfg, tokens, "notfound.example.com", Credential{}, ""},
		{"helper missing", cfg, tokens, "gcr.io", Credential{}, `credential helper docker-credential-absent: exec: "docker-credential-absent": executable file not found in $PATH`},
		{"helper prints garbage", cfg, tokens, "garbage.example.com", Credential{}, "credential helper docker-credential-garbage: get garbage.example.com: invalid character"},
		{"helper fails", cfg, tokens, "failing.example.com", Credential{}, "exit status 3 (stderr: keychain locked)"},
		{"helper hangs", cfg, tokens, "hang.example.com", Credential{}, "docker-credential-hang: get hang.example.com: error getting credentials - err: no answer within 500ms: context deadline exceeded"},
		{"helper floods", cfg, tokens, "huge.example.com", Credential{}, "output larger than"},
		{"credsStore for a host without a helper", storeCfg, tokens, "reg.example.com", Credential{"store-user", "store-pass"}, ""},
		{"credHelpers over credsStore", storeCfg, tokens, "helped.example.com", Credential{"helper-user", "helper-pass"}, ""},
		{"explicit entry beats ECR", cfg, tokens, "111111111111.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "static"}, ""},
		{"ecr-login helper served natively", cfg, tokens, "222222222222.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "from-ecr"}, ""},
		{"helper without an answer for an ECR host", cfg, tokens, "444444444444.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "from-ecr"}, ""},
		{"ECR host without entry", cfg, tokens, "333333333333.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "from-ecr"}, ""},
		{"ECR without config.json", "", tokens, "333333333333.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "from-ecr"}, ""},
		{"ecr-login with ECR disabled runs the helper", cfg, nil, "222222222222.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "from-helper"}, ""},
		{"ECR disabled", "", nil, "333333333333.dkr.ecr.us-west-2.amazonaws.com", Credential{}, ""},
		{"anonymous", cfg, tokens, "quay.io", Credential{}, ""},
		{"missing config file", filepath.Join(dir, "none.json"), tokens, "quay.io", Credential{}, ""},
		{"unreadable config", dir, tokens, "quay.io", Credential{}, "docker config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The real bound, but for the helper that never answers: a
			// loaded machine may take seconds to start a shell.
			c := &Cache{dockerCfg: tc.dockerCfg, ecr: tc.ecr, helperTimeout: helperTimeout}
			if tc.host == "hang.example.com" {
				c.helperTimeout = 500 * time.Millisecond
			}
			got, err := c.credentials(t.Context(), tc.host)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				if !strings.Contains(err.Error(), tc.host) || !strings.Contains(err.Error(), tc.dockerCfg) {
					t.Fatalf("err = %v, want it to name the host and the config file", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("credentials = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	if fake.calls != 1 {
		t.Fatalf("%d token requests, want 1 (cached per region)", fake.calls)
	}
	// Each helper is asked about the key the docker CLI would ask about.
	if got, want := helperAsked(t, helpers, "good"), []string{"helped.example.com", dockerHubKey, "helped.example.com"}; !slices.Equal(got, want) {
		t.Errorf("helper good asked about %q, want %q", got, want)
	}
	if got, want := helperAsked(t, helpers, "store"), []string{"reg.example.com"}; !slices.Equal(got, want) {
		t.Errorf("credsStore asked about %q, want %q", got, want)
	}
}

func TestMetricsRegisterOncePerRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := newMetrics(reg); err == nil || !strings.Contains(err.Error(), "one cache per registerer") {
		t.Fatalf("second registration: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, want := range []string{"warmfleet_image_pulls_total", "warmfleet_image_pull_failures_total",
		"warmfleet_image_bytes_fetched_total", "warmfleet_image_pull_duration_seconds"} {
		if !slices.Contains(names, want) {
			t.Errorf("metric %s not registered (have %v)", want, names)
		}
	}
}

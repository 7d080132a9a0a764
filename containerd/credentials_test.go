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

func TestCredentialsChain(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(`{
		"auths": {
			"reg.example.com": {"auth": "`+base64.StdEncoding.EncodeToString([]byte("u:p"))+`"},
			"111111111111.dkr.ecr.us-west-2.amazonaws.com": {"username": "AWS", "password": "static"}
		},
		"credHelpers": {
			"222222222222.dkr.ecr.us-west-2.amazonaws.com": "ecr-login",
			"gcr.io": "gcloud"
		}}`), 0o600); err != nil {
		t.Fatal(err)
	}
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
		{"explicit entry beats ECR", cfg, tokens, "111111111111.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "static"}, ""},
		{"ecr-login helper served natively", cfg, tokens, "222222222222.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "from-ecr"}, ""},
		{"ECR host without entry", cfg, tokens, "333333333333.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "from-ecr"}, ""},
		{"ECR without config.json", "", tokens, "333333333333.dkr.ecr.us-west-2.amazonaws.com", Credential{"AWS", "from-ecr"}, ""},
		{"other helper", cfg, tokens, "gcr.io", Credential{}, `helper "gcloud" is not supported`},
		{"ecr-login with ECR disabled", cfg, nil, "222222222222.dkr.ecr.us-west-2.amazonaws.com", Credential{}, "not supported"},
		{"ECR disabled", "", nil, "333333333333.dkr.ecr.us-west-2.amazonaws.com", Credential{}, ""},
		{"anonymous", cfg, tokens, "quay.io", Credential{}, ""},
		{"missing config file", filepath.Join(dir, "none.json"), tokens, "quay.io", Credential{}, ""},
		{"unreadable config", dir, tokens, "quay.io", Credential{}, "docker config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cache{dockerCfg: tc.dockerCfg, ecr: tc.ecr}
			got, err := c.credentials(t.Context(), tc.host)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
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

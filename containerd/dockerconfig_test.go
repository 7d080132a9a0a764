package imagecache

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDockerConfigEntryAndHelper(t *testing.T) {
	cfg, err := LoadDockerConfig(filepath.Join("testdata", "docker-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host   string
		cred   Credential
		found  bool
		helper string
	}{
		// containerd's authorizer asks for Docker Hub as registry-1.docker.io;
		// the CLI files it under its index URL, for entries and helpers alike.
		{host: "registry-1.docker.io", cred: Credential{"hub-user", "hub-pass"}, found: true, helper: "hub"},
		{host: "docker.io", cred: Credential{"hub-user", "hub-pass"}, found: true, helper: "hub"},
		{host: "ghcr.io", cred: Credential{"gh-user", "gh-token"}, found: true},
		// The password may itself contain ':'.
		{host: "127.0.0.1:5000", cred: Credential{"local", "pa:ss"}, found: true},
		{host: "127.0.0.1:5001"},
		// A key written as a URL with a path matches its host.
		{host: "registry.example.com", cred: Credential{Secret: "refresh-me"}, found: true},
		{host: "empty.example.com"},
		{host: "123456789012.dkr.ecr.eu-west-1.amazonaws.com", helper: "ecr-login"},
		{host: "gcr.io", helper: "gcloud"},
		{host: "quay.io"},
	} {
		t.Run(tc.host, func(t *testing.T) {
			cred, found := cfg.Entry(tc.host)
			if cred != tc.cred || found != tc.found {
				t.Errorf("Entry = %+v, %v; want %+v, %v", cred, found, tc.cred, tc.found)
			}
			if h := cfg.Helper(tc.host); h != tc.helper {
				t.Errorf("Helper = %q, want %q", h, tc.helper)
			}
		})
	}
}

func TestDockerConfigCredsStoreIsTheDefaultHelper(t *testing.T) {
	cfg, err := ParseDockerConfig([]byte(`{"credsStore": "pass", "credHelpers": {"gcr.io": "gcloud"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.Helper("quay.io"); h != "pass" {
		t.Errorf("Helper(quay.io) = %q, want the credsStore", h)
	}
	if h := cfg.Helper("gcr.io"); h != "gcloud" {
		t.Errorf("Helper(gcr.io) = %q, want its credHelpers entry over the credsStore", h)
	}
}

func TestParseDockerConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, data, err string }{
		{"malformed JSON", `{"auths": [`, "parse"},
		{"auth not base64", `{"auths": {"r.example.com": {"auth": "***"}}}`, "illegal base64"},
		{"auth without colon", `{"auths": {"r.example.com": {"auth": "bm9jb2xvbg=="}}}`, "invalid auth"},
		{"wrong type", `{"credHelpers": ["x"]}`, "parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParseDockerConfig([]byte(tc.data)); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.err)
			}
		})
	}
	if cfg, err := ParseDockerConfig(nil); err != nil || cfg.Helper("x") != "" {
		t.Fatalf("empty content: %v, %v; want an empty config", cfg, err)
	}
}

func TestLoadDockerConfigErrors(t *testing.T) {
	dir := t.TempDir()
	if cfg, err := LoadDockerConfig(filepath.Join(dir, "missing.json")); err != nil || cfg == nil {
		t.Fatalf("missing file: %v, %v; want an empty config", cfg, err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"auths": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDockerConfig(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("malformed file: %v, want an error naming it", err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, maxDockerConfigSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDockerConfig(big); err == nil || !strings.Contains(err.Error(), "larger") {
		t.Fatalf("huge file: %v", err)
	}
	if _, err := LoadDockerConfig(dir); err == nil {
		t.Fatal("a directory parsed as config")
	}
}

func TestConfigKey(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"registry-1.docker.io", dockerHubKey},
		{"docker.io", dockerHubKey},
		{"Index.Docker.io", dockerHubKey},
		{"registry.hub.docker.com", dockerHubKey},
		{"registry-1.docker.io:443", "registry-1.docker.io:443"},
		{"127.0.0.1:5000", "127.0.0.1:5000"},
		{"ghcr.io", "ghcr.io"},
	} {
		if got := configKey(tc.in); got != tc.want {
			t.Errorf("configKey(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func FuzzParseDockerConfig(f *testing.F) {
	if seed, err := os.ReadFile(filepath.Join("testdata", "docker-config.json")); err == nil {
		f.Add(seed, "registry-1.docker.io")
	}
	f.Add([]byte(`{"auths":{"h":{"auth":"YTpi"}}}`), "h")
	f.Add([]byte(`{"auths":null,"credHelpers":{"":""},"credsStore":"x"}`), "")
	f.Add([]byte(`[]`), "x")
	f.Fuzz(func(t *testing.T, data []byte, host string) {
		cfg, err := ParseDockerConfig(data)
		if err != nil {
			return
		}
		cfg.Helper(host)
		if cred, found := cfg.Entry(host); found && cred.Username == "" && cred.Secret == "" {
			t.Fatal("found an empty credential")
		}
	})
}

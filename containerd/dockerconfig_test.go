package imagecache

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDockerConfigLookup(t *testing.T) {
	cfg, err := LoadDockerConfig(filepath.Join("testdata", "docker-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host   string
		cred   Credential
		found  bool
		helper string
		err    string
	}{
		// containerd's authorizer asks for Docker Hub as registry-1.docker.io.
		{host: "registry-1.docker.io", cred: Credential{"hub-user", "hub-pass"}, found: true},
		{host: "docker.io", cred: Credential{"hub-user", "hub-pass"}, found: true},
		{host: "GHCR.io", cred: Credential{"gh-user", "gh-token"}, found: true},
		// The password may itself contain ':'.
		{host: "127.0.0.1:5000", cred: Credential{"local", "pa:ss"}, found: true},
		{host: "127.0.0.1:5001"},
		{host: "registry.example.com", cred: Credential{Secret: "refresh-me"}, found: true},
		{host: "broken.example.com", err: "not base64"},
		{host: "nocolon.example.com", err: "user:password"},
		{host: "empty.example.com", err: "neither"},
		{host: "123456789012.dkr.ecr.eu-west-1.amazonaws.com", helper: "ecr-login"},
		{host: "gcr.io", helper: "gcloud"},
		{host: "quay.io"},
	} {
		t.Run(tc.host, func(t *testing.T) {
			cred, found, helper, err := cfg.Lookup(tc.host)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil || cred != tc.cred || found != tc.found || helper != tc.helper {
				t.Fatalf("Lookup = %+v, %v, %q, %v; want %+v, %v, %q", cred, found, helper, err, tc.cred, tc.found, tc.helper)
			}
		})
	}
}

func TestDockerConfigExactKeyWins(t *testing.T) {
	cfg, err := ParseDockerConfig([]byte(`{"auths":{
		"https://index.docker.io/v1/": {"username": "legacy", "password": "x"},
		"docker.io": {"username": "exact", "password": "y"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if cred, _, _, _ := cfg.Lookup("registry-1.docker.io"); cred.Username != "exact" {
		t.Fatalf("got %q, want the entry keyed exactly docker.io", cred.Username)
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

func TestNormalizeRegistryHost(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://index.docker.io/v1/", "docker.io"},
		{"index.docker.io", "docker.io"},
		{"registry-1.docker.io", "docker.io"},
		{"registry-1.docker.io:443", "registry-1.docker.io:443"},
		{"HTTP://Reg.Example.com:5000/x", "reg.example.com:5000"},
		{"[::1]:5000", "[::1]:5000"},
		{"", ""},
		{"https://", ""},
		{"user@host", ""},
		{"a b", ""},
	} {
		if got := normalizeRegistryHost(tc.in); got != tc.want {
			t.Errorf("normalizeRegistryHost(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func FuzzParseDockerConfig(f *testing.F) {
	if seed, err := os.ReadFile(filepath.Join("testdata", "docker-config.json")); err == nil {
		f.Add(seed, "registry-1.docker.io")
	}
	f.Add([]byte(`{"auths":{"h":{"auth":"YTpi"}}}`), "h")
	f.Add([]byte(`{"auths":null,"credHelpers":{"":""}}`), "")
	f.Add([]byte(`[]`), "x")
	f.Fuzz(func(t *testing.T, data []byte, host string) {
		cfg, err := ParseDockerConfig(data)
		if err != nil {
			return
		}
		cred, found, helper, err := cfg.Lookup(host)
		if err != nil && (found || cred != (Credential{})) {
			t.Fatalf("error %v with a credential %+v", err, cred)
		}
		if found && helper != "" {
			t.Fatal("found a credential and a helper")
		}
		if found && cred.Username == "" && cred.Secret == "" {
			t.Fatal("found an empty credential")
		}
	})
}

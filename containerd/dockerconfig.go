package imagecache

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
)

// Credential is what the registry authorizer needs for one host. An empty
// Username means Secret is an identity (refresh) token.
type Credential struct {
	Username string
	Secret   string
}

// DockerConfig is the part of a docker config.json that names registry
// credentials: "auths" entries, plus "credHelpers" so that a host that
// relies on a helper gets a clear error instead of an anonymous 401.
type DockerConfig struct {
	// entries maps a normalized registry host to its credential, or to
	// the error that decoding its entry gave.
	entries map[string]authEntry
	// helpers maps a normalized host to its credential helper's name.
	helpers map[string]string
}

type authEntry struct {
	key  string // the key as written, for messages
	cred Credential
	err  error
}

type rawDockerConfig struct {
	Auths       map[string]rawAuth `json:"auths"`
	CredHelpers map[string]string  `json:"credHelpers"`
}

type rawAuth struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
}

// maxDockerConfigSize bounds what is read from disk; real files are a few
// KiB even with dozens of registries.
const maxDockerConfigSize = 4 << 20

// LoadDockerConfig reads and parses a docker config.json. A missing file is
// an empty config: no credentials, anonymous pulls.
func LoadDockerConfig(path string) (*DockerConfig, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return &DockerConfig{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("docker config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxDockerConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("docker config %s: %w", path, err)
	}
	if len(data) > maxDockerConfigSize {
		return nil, fmt.Errorf("docker config %s: larger than %d bytes", path, maxDockerConfigSize)
	}
	cfg, err := ParseDockerConfig(data)
	if err != nil {
		return nil, fmt.Errorf("docker config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseDockerConfig parses config.json content. Malformed JSON is an error;
// a malformed entry only fails lookups of its own host.
func ParseDockerConfig(data []byte) (*DockerConfig, error) {
	var raw rawDockerConfig
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	cfg := &DockerConfig{entries: map[string]authEntry{}, helpers: map[string]string{}}
	// Sorted keys make the winner deterministic when two keys name one
	// host ("https://index.docker.io/v1/" and "docker.io"): a key that is
	// exactly the host wins, else the first in order.
	keys := slices.Sorted(maps.Keys(raw.Auths))
	for _, key := range keys {
		host := normalizeRegistryHost(key)
		if host == "" {
			continue
		}
		if old, ok := cfg.entries[host]; ok && (old.key == host || key != host) {
			continue
		}
		cred, err := decodeAuth(raw.Auths[key])
		cfg.entries[host] = authEntry{key: key, cred: cred, err: err}
	}
	for key, helper := range raw.CredHelpers {
		if host := normalizeRegistryHost(key); host != "" && helper != "" {
			cfg.helpers[host] = helper
		}
	}
	return cfg, nil
}

func decodeAuth(a rawAuth) (Credential, error) {
	if a.IdentityToken != "" {
		return Credential{Secret: a.IdentityToken}, nil
	}
	if a.Auth != "" {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(a.Auth))
		if err != nil {
			return Credential{}, fmt.Errorf("auth field is not base64: %w", err)
		}
		user, pass, ok := strings.Cut(string(raw), ":")
		if !ok || user == "" {
			return Credential{}, fmt.Errorf("auth field does not decode to user:password")
		}
		return Credential{Username: user, Secret: pass}, nil
	}
	if a.Username != "" {
		return Credential{Username: a.Username, Secret: a.Password}, nil
	}
	return Credential{}, fmt.Errorf("entry has neither auth, username nor identitytoken")
}

// Lookup returns the credential for a registry host (as containerd's
// authorizer names it: "registry-1.docker.io", "127.0.0.1:5000").
// found is false when the config names no credential for the host; helper
// is then the credential helper configured for it, if any.
func (c *DockerConfig) Lookup(host string) (cred Credential, found bool, helper string, err error) {
	if c == nil {
		return Credential{}, false, "", nil
	}
	h := normalizeRegistryHost(host)
	if e, ok := c.entries[h]; ok {
		if e.err != nil {
			return Credential{}, false, "", fmt.Errorf("credentials for %s (key %q): %w", host, e.key, e.err)
		}
		return e.cred, true, "", nil
	}
	return Credential{}, false, c.helpers[h], nil
}

// normalizeRegistryHost maps the forms a config.json key or a registry
// host takes to one host[:port]: scheme and path dropped, lower case, and
// every Docker Hub alias to "docker.io". It returns "" for a key that
// names no host.
func normalizeRegistryHost(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s = s[:i]
	}
	s = strings.ToLower(s)
	if s == "" || strings.ContainsAny(s, " \t\r\n@?#") {
		return ""
	}
	host := s
	if h, _, err := net.SplitHostPort(s); err == nil {
		host = h
	}
	switch host {
	case "docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com":
		if host == s {
			return "docker.io"
		}
	}
	return s
}

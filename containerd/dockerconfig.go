package imagecache

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/docker/cli/cli/config/configfile"
	dockercreds "github.com/docker/cli/cli/config/credentials"
	"github.com/docker/docker-credential-helpers/client"
	helpercreds "github.com/docker/docker-credential-helpers/credentials"
)

// Credential is what the registry authorizer needs for one host. An empty
// Username means Secret is an identity (refresh) token.
type Credential struct {
	Username string
	Secret   string
}

// DockerConfig is a docker config.json as the docker CLI reads it
// (github.com/docker/cli/cli/config/configfile): "auths" entries, a
// "credHelpers" helper per registry and a "credsStore" helper for every
// other registry. Lookups follow the CLI's rules, so a file that works for
// `docker pull` works here.
type DockerConfig struct {
	file *configfile.ConfigFile
}

// maxDockerConfigSize bounds what is read from disk; real files are a few
// KiB even with dozens of registries.
const maxDockerConfigSize = 4 << 20

// LoadDockerConfig reads and parses a docker config.json. A missing file is
// an empty config: no credentials, anonymous pulls.
func LoadDockerConfig(path string) (*DockerConfig, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return ParseDockerConfig(nil)
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

// ParseDockerConfig parses config.json content. As for the docker CLI,
// malformed JSON or an "auth" field that is not base64 of user:password
// fails the whole file.
func ParseDockerConfig(data []byte) (*DockerConfig, error) {
	f := configfile.New("")
	if err := f.LoadFromReader(bytes.NewReader(data)); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	return &DockerConfig{file: f}, nil
}

// dockerHubKey is the key under which the docker CLI files Docker Hub's
// credentials, and the server URL it asks a helper about for Docker Hub.
const dockerHubKey = "https://index.docker.io/v1/"

// configKey maps a registry host as containerd's authorizer names it
// ("registry-1.docker.io", "127.0.0.1:5000") to the key the docker CLI
// uses for it in config.json and with helpers: every Docker Hub alias is
// one key, other hosts are themselves.
func configKey(host string) string {
	switch strings.ToLower(host) {
	case "docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com":
		return dockerHubKey
	}
	return host
}

// Helper returns the credential helper (the suffix of a
// docker-credential-<name> executable) that answers for host: its
// "credHelpers" entry, else "credsStore", else "".
func (c *DockerConfig) Helper(host string) string {
	if c == nil || c.file == nil {
		return ""
	}
	if h, ok := c.file.CredentialHelpers[configKey(host)]; ok {
		return h
	}
	return c.file.CredentialsStore
}

// Entry returns the credential written under "auths" for host, matched as
// the docker CLI does (exact key, else a key whose host part is host).
// found is false when there is none or it holds neither a user nor a
// token.
func (c *DockerConfig) Entry(host string) (cred Credential, found bool) {
	if c == nil || c.file == nil {
		return Credential{}, false
	}
	// The file store only reads: it writes on Store, which is never called.
	ac, err := dockercreds.NewFileStore(c.file).Get(configKey(host))
	switch {
	case err != nil:
		return Credential{}, false
	case ac.IdentityToken != "":
		return Credential{Secret: ac.IdentityToken}, true
	case ac.Username != "":
		return Credential{Username: ac.Username, Secret: ac.Password}, true
	}
	return Credential{}, false
}

// helperTimeout bounds one credential helper run: a helper that hangs
// (waiting for a keychain prompt nobody answers) must fail the pull, not
// block it for good.
const helperTimeout = 30 * time.Second

// maxHelperOutput bounds what is read from a helper; a real answer is one
// small JSON object.
const maxHelperOutput = 1 << 20

// helperPrefix is what the docker CLI puts before a helper's name to find
// its executable in PATH.
const helperPrefix = "docker-credential-"

// runCredentialHelper asks the docker-credential-<helper> executable in
// PATH for host's credential through the docker-credential-helpers
// protocol ("get", the server URL on stdin, JSON on stdout). found is false
// when the helper answers that it has none.
func runCredentialHelper(ctx context.Context, helper, host string, timeout time.Duration) (cred Credential, found bool, err error) {
	name := helperPrefix + helper
	path, err := exec.LookPath(name)
	if err != nil {
		return Credential{}, false, fmt.Errorf("credential helper %s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	prog := func(args ...string) client.Program {
		return &helperRun{ctx: ctx, timeout: timeout, path: path, args: args}
	}
	c, err := client.Get(prog, configKey(host))
	switch {
	case helpercreds.IsErrCredentialsNotFound(err):
		return Credential{}, false, nil
	case err != nil:
		return Credential{}, false, fmt.Errorf("credential helper %s: get %s: %w", name, configKey(host), err)
	case c.Username == "<token>":
		// The helpers' convention for an identity token.
		return Credential{Secret: c.Secret}, c.Secret != "", nil
	}
	return Credential{Username: c.Username, Secret: c.Secret}, c.Username != "" || c.Secret != "", nil
}

// helperRun is one run of a helper for client.Get: unlike the library's
// own runner it stops with ctx, bounds what it reads, and keeps the
// helper's stderr for the error instead of printing it on the daemon's.
type helperRun struct {
	ctx     context.Context
	timeout time.Duration // ctx's, for the message
	path    string
	args    []string
	stdin   io.Reader
}

func (r *helperRun) Input(in io.Reader) { r.stdin = in }

func (r *helperRun) Output() ([]byte, error) {
	cmd := exec.CommandContext(r.ctx, r.path, r.args...)
	cmd.Stdin = r.stdin
	// A helper's own children may hold the pipes open after it is killed.
	cmd.WaitDelay = time.Second
	stdout := &capped{max: maxHelperOutput}
	stderr := &capped{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	switch {
	case r.ctx.Err() != nil:
		return nil, fmt.Errorf("no answer within %s: %w", r.timeout, r.ctx.Err())
	case stdout.over:
		return nil, fmt.Errorf("output larger than %d bytes", stdout.max)
	case err != nil && stderr.buf.Len() > 0:
		err = fmt.Errorf("%w (stderr: %s)", err, strings.TrimSpace(stderr.buf.String()))
	}
	return stdout.buf.Bytes(), err
}

// capped keeps the first max bytes written and notes whether more came.
// The buffer is a field, not embedded: an embedded bytes.Buffer's ReadFrom
// would let io.Copy bypass Write and its cap.
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); len(p) > room {
		c.over = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

package gossip

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// keyFilePrivate reports whether a key file with permissions perm and group
// fileGID may be used by a process whose effective group is procGID: no
// access for others, no group write, and group read only when the group is
// the process's own and not root's. That last case is how Kubernetes gives
// a Secret to a non-root container: with an fsGroup, the kubelet makes the
// Secret's files group-readable by that group whatever their defaultMode.
func keyFilePrivate(perm os.FileMode, fileGID, procGID int) bool {
	switch {
	case perm&0o037 != 0:
		return false
	case perm&0o040 != 0:
		return fileGID == procGID && procGID > 0
	}
	return true
}

// KeySize is the cluster key length: AES-256-GCM.
const KeySize = 32

// GenerateKey returns a new random cluster key.
func GenerateKey() ([]byte, error) {
	k := make([]byte, KeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("generate cluster key: %w", err)
	}
	return k, nil
}

// EncodeKey returns the key file form of a key: standard base64.
func EncodeKey(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

// ParseKey decodes one base64 cluster key.
func ParseKey(s string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("cluster key is not base64: %w", err)
	}
	if len(k) != KeySize {
		return nil, fmt.Errorf("cluster key is %d bytes, want %d (write one with `warmfleet keygen`)", len(k), KeySize)
	}
	return k, nil
}

// LoadKeyFile reads a cluster key file: one base64 key per line, the first
// being the key used to encrypt, the others accepted for decryption (which is
// how a rotation survives a restart: install the new key on every node, then
// make it first, then remove the old line). Blank lines and lines starting
// with '#' are ignored. The file must be private: see keyFilePrivate.
func LoadKeyFile(path string) ([][]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cluster key file: %w", err)
	}
	fileGID := -1
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fileGID = int(sys.Gid)
	}
	if !keyFilePrivate(st.Mode().Perm(), fileGID, os.Getegid()) {
		return nil, fmt.Errorf("cluster key file %s has mode %v: it must be private (chmod 600)", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster key file: %w", err)
	}
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		k, err := ParseKey(s)
		if err != nil {
			return nil, fmt.Errorf("cluster key file %s line %d: %w", path, line, err)
		}
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cluster key file %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("cluster key file %s holds no key", path)
	}
	return keys, nil
}

// WriteKeyFile replaces the key file at path with keys, the key in use
// first, in the format LoadKeyFile reads. The file is private from its
// first byte and replaced by a rename, so a crash leaves the old keys or the
// new ones, never a torn file that would cut the node off its fleet.
func WriteKeyFile(path string, keys [][]byte) error {
	var b strings.Builder
	b.WriteString("# warmfleet cluster keys: the first encrypts, all decrypt.\n")
	for _, k := range keys {
		b.WriteString(EncodeKey(k) + "\n")
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".warmfleet-key-*")
	if err != nil {
		return fmt.Errorf("cluster key file: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.WriteString(b.String())
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("cluster key file %s: %w", path, err)
	}
	return nil
}

package p2p

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// A node's identity is an ed25519 key pair of its own, made once and kept
// in its data directory. Every member holds the cluster key, so the cluster
// key proves membership but not which member: the identity key does. The
// handshake proves it (a signature over the handshake), gossip advertises
// the public half with the node's metadata, and peers pin a node ID to the
// first key they see for it (see KeyDirectory): a member that claims
// another's ID cannot sign as it.

// IdentityFile is the name of the identity key in a node's data directory.
const IdentityFile = "node.key"

const identityPEMType = "PRIVATE KEY"

// LoadIdentity reads the node's identity key at path, making it first when
// the file does not exist (mode 0600, created whole or not at all: written
// to a temporary file, synced, then linked into place, so a crash leaves
// no half key and two processes racing to make it agree on one). A file
// that holds anything but a PKCS#8 ed25519 key is an error, never replaced:
// a new key is a new identity, which peers that pinned the old one refuse.
func LoadIdentity(path string) (ed25519.PrivateKey, error) {
	k, err := readIdentity(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	if err := createExclusive(path, pem.EncodeToMemory(&pem.Block{Type: identityPEMType, Bytes: der})); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return readIdentity(path) // another process made it first
		}
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	return priv, nil
}

func readIdentity(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	k, err := parseIdentity(b)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity key %s: %w (move it away to make a new identity; peers that pinned the old key then refuse this node until they forget it)", path, err)
	}
	return k, nil
}

// parseIdentity decodes a PEM PKCS#8 ed25519 private key and nothing else.
func parseIdentity(b []byte) (ed25519.PrivateKey, error) {
	blk, rest := pem.Decode(b)
	if blk == nil || blk.Type != identityPEMType {
		return nil, errors.New("not a PEM private key")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("data after the key")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("not a PKCS#8 key: %w", err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T key, want ed25519", k)
	}
	return ek, nil
}

// createExclusive writes data to path as a new 0600 file, whole or not at
// all; fs.ErrExist if path exists.
func createExclusive(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".node.key-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// A link, unlike a rename, fails when path exists.
	if err := os.Link(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

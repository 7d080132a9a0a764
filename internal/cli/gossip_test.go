package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
)

func TestGossipKeyRequest(t *testing.T) {
	dir := t.TempDir()
	k1, _ := gossip.GenerateKey()
	k2, _ := gossip.GenerateKey()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	one := write("one.key", gossip.EncodeKey(k1)+"\n", 0o600)
	two := write("two.key", gossip.EncodeKey(k1)+"\n"+gossip.EncodeKey(k2)+"\n", 0o600)
	open := write("open.key", gossip.EncodeKey(k1)+"\n", 0o644)
	fp := gossip.Fingerprint(k1)
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name, op, file string
		fp             *string
		want           api.GossipKeyRequest
		usage          bool
		errContains    string
	}{
		{name: "install sends the key", op: "install", file: one, want: api.GossipKeyRequest{Op: "install", Key: gossip.EncodeKey(k1)}},
		{name: "use sends only the fingerprint", op: "use", file: one, fp: str(""), want: api.GossipKeyRequest{Op: "use", Fingerprint: fp}},
		{name: "remove by fingerprint", op: "remove", fp: str(fp), want: api.GossipKeyRequest{Op: "remove", Fingerprint: fp}},
		{name: "install needs a file", op: "install", usage: true, errContains: "--key-file"},
		{name: "use needs something", op: "use", fp: str(""), usage: true, errContains: "--fingerprint"},
		{name: "not both", op: "use", file: one, fp: str(fp), usage: true, errContains: "not both"},
		{name: "bad fingerprint", op: "remove", fp: str("sha256:zz"), usage: true, errContains: "16 hex"},
		{name: "two keys are ambiguous", op: "install", file: two, usage: true, errContains: "holds 2 keys"},
		{name: "readable by others", op: "install", file: open, errContains: "chmod 600"},
		{name: "missing file", op: "use", file: filepath.Join(dir, "nope"), fp: str(""), errContains: "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := gossipKeyRequest(tc.op, tc.file, tc.fp)
			if tc.errContains != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errContains) || errors.Is(err, errUsage) != tc.usage {
					t.Fatalf("err %v, want one containing %q (usage %v)", err, tc.errContains, tc.usage)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestGossipKeysUsage(t *testing.T) {
	for _, args := range [][]string{
		{"gossip"},
		{"gossip", "nope"},
		{"gossip", "keys"},
		{"gossip", "keys", "rotate"},
		{"gossip", "keys", "install"},
		{"gossip", "keys", "list", "extra"},
	} {
		var out, errOut strings.Builder
		if code := Run(t.Context(), args, &Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errOut.String())
		}
	}
}

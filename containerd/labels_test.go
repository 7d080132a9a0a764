package imagecache

import (
	"fmt"
	"strings"
	"testing"
)

func TestValidateOwner(t *testing.T) {
	for _, tc := range []struct {
		owner string
		ok    bool
	}{
		{"a", true},
		{"team-a/llama-70b", true},
		{"Deploy_1.v2", true},
		{"0abc", true},
		{strings.Repeat("x", maxOwnerLen), true},
		{"", false},
		{strings.Repeat("x", maxOwnerLen+1), false},
		{"-a", false},
		{"/a", false},
		{".hidden", false},
		{"a b", false},
		{"a=b", false},
		{"a\nb", false},
		{"naïve", false},
		{"a:b", false},
	} {
		err := ValidateOwner(tc.owner)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateOwner(%q) = %v, want ok=%v", tc.owner, err, tc.ok)
		}
	}
}

func TestOwnersRoundTrip(t *testing.T) {
	labels := map[string]string{
		OwnerLabel("b"):                "t",
		OwnerLabel("a/x"):              "t",
		LabelManaged:                   "true",
		"io.cri-containerd.image":      "managed",
		LabelOwnerPrefix + "bad owner": "t", // written by hand: ignored
		LabelOwnerPrefix:               "t",
		"warmfleet.io/ownerish":        "t",
	}
	if got, want := fmt.Sprint(Owners(labels)), "[a/x b]"; got != want {
		t.Fatalf("Owners = %s, want %s", got, want)
	}
	if !IsManaged(labels) || IsManaged(map[string]string{LabelManaged: "yes"}) || IsManaged(nil) {
		t.Fatal("IsManaged wrong")
	}
}

func TestPullLabels(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing map[string]string
		existed  bool
		want     map[string]string
	}{
		{"new image is managed", nil, false,
			map[string]string{LabelManaged: "true", OwnerLabel("o"): "now"}},
		{"foreign image stays foreign", map[string]string{"io.cri-containerd.image": "managed"}, true,
			map[string]string{"io.cri-containerd.image": "managed", OwnerLabel("o"): "now"}},
		{"managed image keeps its owners and first claim time",
			map[string]string{LabelManaged: "true", OwnerLabel("o"): "then", OwnerLabel("p"): "then"}, true,
			map[string]string{LabelManaged: "true", OwnerLabel("o"): "then", OwnerLabel("p"): "then"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pullLabels(tc.existing, tc.existed, "o", "now")
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("pullLabels = %v, want %v", got, tc.want)
			}
		})
	}
	in := map[string]string{"x": "1"}
	pullLabels(in, true, "o", "now")
	if len(in) != 1 {
		t.Fatal("pullLabels modified its input")
	}
}

func TestWithoutOwners(t *testing.T) {
	got := withoutOwners(map[string]string{LabelManaged: "true", OwnerLabel("a"): "t", "x": "y"})
	if fmt.Sprint(got) != fmt.Sprint(map[string]string{LabelManaged: "true", "x": "y"}) {
		t.Fatalf("withoutOwners = %v", got)
	}
}

func TestDecideDelete(t *testing.T) {
	for _, tc := range []struct {
		name    string
		managed bool
		owners  []string
		usedBy  []string
		del     bool
		reason  string
	}{
		{"managed, unowned, unused", true, nil, nil, true, "removed"},
		{"foreign", false, nil, nil, false, "not pulled by warmfleet"},
		{"foreign and used", false, nil, []string{"c"}, false, "not pulled by warmfleet"},
		{"still owned", true, []string{"a", "b"}, nil, false, "still owned by a, b"},
		{"in use", true, nil, []string{"c1", "c2"}, false, "in use by container c1, c2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideDelete(tc.managed, tc.owners, tc.usedBy)
			if d.Delete != tc.del || !strings.Contains(d.Reason, tc.reason) {
				t.Fatalf("decideDelete = %+v, want delete=%v reason ~%q", d, tc.del, tc.reason)
			}
		})
	}
}

func TestContainersUsing(t *testing.T) {
	const (
		name   = "docker.io/library/app:v1"
		target = "sha256:aaaa"
		config = "sha256:cccc"
	)
	cs := []containerImage{
		{"by-tag", name},
		{"by-digest-ref", "docker.io/library/app@sha256:aaaa"},
		{"by-config-id", config},
		{"by-target", target},
		{"other", "docker.io/library/other:v1"},
		{"no-image", ""},
		{"unknown-name", "gone:v1"},
	}
	targetOf := map[string]string{
		"docker.io/library/app@sha256:aaaa": target,
		"docker.io/library/other:v1":        "sha256:bbbb",
		"gone:v1":                           "",
	}
	got := containersUsing(name, target, config, cs, targetOf)
	if want := "[by-config-id by-digest-ref by-tag by-target]"; fmt.Sprint(got) != want {
		t.Fatalf("containersUsing = %v, want %s", got, want)
	}
	if got := containersUsing(name, target, "", []containerImage{{"x", ""}}, nil); len(got) != 0 {
		t.Fatalf("empty config digest matched a container without image: %v", got)
	}
}

func TestNormalizeRef(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"nginx", "docker.io/library/nginx:latest"},
		{"nginx:1.27", "docker.io/library/nginx:1.27"},
		{"ghcr.io/org/img:v1", "ghcr.io/org/img:v1"},
		{"127.0.0.1:5000/a/b:v1", "127.0.0.1:5000/a/b:v1"},
		{"reg.io/a@sha256:" + strings.Repeat("a", 64), "reg.io/a@sha256:" + strings.Repeat("a", 64)},
		{"reg.io/a:v1@sha256:" + strings.Repeat("a", 64), "reg.io/a@sha256:" + strings.Repeat("a", 64)},
		{"", ""},
		{"reg.io/A:v1", ""},
		{"reg.io/a:", ""},
		{"reg.io/a@sha256:short", ""},
		{"a b", ""},
		{strings.Repeat("a", 5000), ""},
	} {
		got, err := NormalizeRef(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("NormalizeRef(%.40q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("NormalizeRef(%q) = %q, %v, want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestDigestNames(t *testing.T) {
	d := "sha256:" + strings.Repeat("b", 64)
	if got, err := digestName("docker.io/library/nginx:latest", d); err != nil || got != "docker.io/library/nginx@"+d {
		t.Fatalf("digestName = %q, %v", got, err)
	}
	if !isDigestRef("reg.io/a@"+d) || isDigestRef("reg.io/a:v1") || isDigestRef("::") {
		t.Fatal("isDigestRef wrong")
	}
}

func FuzzNormalizeRef(f *testing.F) {
	for _, s := range []string{"nginx", "127.0.0.1:5000/a/b:v1", "reg.io/a@sha256:" + strings.Repeat("a", 64), "", "A/b", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		name, err := NormalizeRef(ref)
		if err != nil {
			return
		}
		// Normalizing is idempotent: the stored name is a valid reference
		// that maps to itself.
		again, err := NormalizeRef(name)
		if err != nil || again != name {
			t.Fatalf("NormalizeRef(%q) = %q, which normalizes to %q, %v", ref, name, again, err)
		}
	})
}

func FuzzOwners(f *testing.F) {
	f.Add("team-a/llama")
	f.Add("bad owner")
	f.Fuzz(func(t *testing.T, owner string) {
		if ValidateOwner(owner) != nil {
			return
		}
		got := Owners(map[string]string{OwnerLabel(owner): "t"})
		if len(got) != 1 || got[0] != owner {
			t.Fatalf("owner %q does not round-trip: %v", owner, got)
		}
		if len(OwnerLabel(owner)) > 4096-len("2006-01-02T15:04:05Z") {
			t.Fatalf("label key too long for containerd: %d", len(OwnerLabel(owner)))
		}
	})
}

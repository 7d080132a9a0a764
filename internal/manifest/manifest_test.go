package manifest

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/tools/txtar"
)

var update = flag.Bool("update", false, "rewrite the want sections of testdata/*.txtar")

// TestData runs testdata/*.txtar, each a case in the manner of etcd raft's
// data-driven tests:
//
//	-- args --          owner=..., prune=true, mode=apply|delete, input=...
//	-- current/O.yaml --  what the daemon holds, applied by owner O ("@hand": by hand)
//	-- input.yaml --    the file (or input/*.yaml, a directory) given to -f
//	-- want --          the diff, or "error:" and the error
//
// go test -run TestData -update rewrites the want sections.
func TestData(t *testing.T) {
	abs, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	// Absolute: each case works in a directory of its own.
	files, err := filepath.Glob(filepath.Join(abs, "*.txtar"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test data: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txtar"), func(t *testing.T) {
			ar, err := txtar.ParseFile(file)
			if err != nil {
				t.Fatal(err)
			}
			got := run(t, ar)
			i := section(ar, "want")
			if *update {
				if i < 0 {
					ar.Files = append(ar.Files, txtar.File{Name: "want"})
					i = len(ar.Files) - 1
				}
				ar.Files[i].Data = []byte(got)
				if err := os.WriteFile(file, txtar.Format(ar), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if i < 0 {
				t.Fatal("no want section (run with -update)")
			}
			if want := string(ar.Files[i].Data); got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func section(ar *txtar.Archive, name string) int {
	for i, f := range ar.Files {
		if f.Name == name {
			return i
		}
	}
	return -1
}

// run lays the case's files out in a fresh directory, works there (so
// positions read "input.yaml:3") and returns what the case prints.
func run(t *testing.T, ar *txtar.Archive) string {
	dir := t.TempDir()
	args := map[string]string{"owner": "team-a", "mode": "apply", "input": "input.yaml"}
	var current []Current
	for _, f := range ar.Files {
		switch {
		case f.Name == "args":
			for _, line := range strings.Fields(string(f.Data)) {
				k, v, _ := strings.Cut(line, "=")
				args[k] = v
			}
		case strings.HasPrefix(f.Name, "current/"):
			owner := strings.TrimSuffix(strings.TrimPrefix(f.Name, "current/"), ".yaml")
			if owner == "@hand" {
				owner = ""
			}
			objs, err := Decode(f.Name, bytes.NewReader(f.Data))
			if err != nil {
				t.Fatalf("current state: %v", err)
			}
			for _, o := range objs {
				// What the daemon gives back: specs and endpoints, no names.
				held := FromEndpoint(o.Endpoint)
				if o.Kind != KindEndpoint {
					held = FromSpec(o.Spec)
				}
				current = append(current, Current{Object: held, AppliedBy: owner})
			}
		case f.Name != "want":
			p := filepath.Join(dir, f.Name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, f.Data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Chdir(dir)
	objs, err := Load(args["input"], strings.NewReader(""))
	if err != nil {
		return "error:\n" + err.Error() + "\n"
	}
	var plan Plan
	if args["mode"] == "delete" {
		plan, err = PlanDelete(current, objs, args["owner"])
	} else {
		plan, err = MakePlan(current, objs, args["owner"], args["prune"] == "true")
	}
	if err != nil {
		var ce *ConflictError
		if !errors.As(err, &ce) {
			t.Errorf("plan error %v is not a *ConflictError", err)
		}
		return "error:\n" + err.Error() + "\n"
	}
	var b strings.Builder
	if err := plan.Diff(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func FuzzDecode(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.txtar")
	for _, s := range seeds {
		if ar, err := txtar.ParseFile(s); err == nil {
			for _, file := range ar.Files {
				if strings.HasSuffix(file.Name, ".yaml") {
					f.Add(file.Data)
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := Decode("fuzz.yaml", bytes.NewReader(data))
		if err != nil {
			if objs != nil {
				t.Fatalf("error %v with %d objects", err, len(objs))
			}
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error %q does not say where", err)
			}
			return
		}
		// Whatever decodes is something the API would accept.
		for _, o := range objs {
			var verr error
			switch o.Kind {
			case KindModelCache, KindImageCache:
				verr = o.Spec.Validate()
			case KindEndpoint:
				verr = o.Endpoint.Validate()
			default:
				t.Fatalf("decoded kind %q", o.Kind)
			}
			if verr != nil {
				t.Fatalf("decoded %+v fails validation: %v", o, verr)
			}
		}
	})
}

func TestDecodeLimits(t *testing.T) {
	big := bytes.Repeat([]byte("#"), MaxBytes+1)
	if _, err := Decode("big.yaml", bytes.NewReader(big)); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("oversized input: %v", err)
	}
	doc := "apiVersion: warmfleet.io/v1alpha1\nkind: Endpoint\nmetadata: {name: e}\nspec: {model: m, url: 'http://h:1'}\n"
	many := strings.Repeat(doc+"---\n", MaxDocuments+1)
	if _, err := Decode("many.yaml", strings.NewReader(many)); err == nil || !strings.Contains(err.Error(), "more than 1000 documents") {
		t.Errorf("too many documents: %v", err)
	}
}

func TestOwners(t *testing.T) {
	if _, err := DefaultOwner("-"); err == nil {
		t.Error("stdin got a default owner")
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "caches.yaml")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for arg, want := range map[string]string{dir: "dir:" + dir, file: "file:" + file} {
		if got, err := DefaultOwner(arg); err != nil || got != want {
			t.Errorf("DefaultOwner(%s) = %q, %v; want %q", arg, got, err, want)
		}
	}
	if _, err := DefaultOwner(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("missing file got an owner")
	}
	for _, bad := range []string{"", "a\nb", "\xff", strings.Repeat("o", MaxOwnerLen+1)} {
		if ValidateOwner(bad) == nil {
			t.Errorf("ValidateOwner(%q) = nil", bad)
		}
	}
	if _, err := MakePlan(nil, nil, "", false); err == nil {
		t.Error("plan with no owner")
	}
}

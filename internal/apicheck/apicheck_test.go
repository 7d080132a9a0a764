package apicheck

import (
	"encoding/json"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/warmfleet/warmfleet"

// pending are the leaks known when this test was written, with why they
// are still there. The test fails when one is fixed and still listed, so the
// list only shrinks.
var pending = map[string]string{}

// TestPublicAPIsExposeNoInternalType type-checks every public package from
// its compiled export data and walks each exported identifier's type.
func TestPublicAPIsExposeNoInternalType(t *testing.T) {
	pkgs, exports := listPublic(t)
	if len(pkgs) < 10 {
		t.Fatalf("found only %d public packages: %q", len(pkgs), pkgs)
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var found []string
	for _, path := range pkgs {
		pkg, err := imp.Import(path)
		if err != nil {
			t.Fatalf("import %s: %v", path, err)
		}
		found = append(found, leaks(pkg)...)
	}
	for _, l := range found {
		if _, ok := pending[l]; !ok {
			t.Errorf("public API mentions an internal type: %s", l)
		}
	}
	for l := range pending {
		if !slices.Contains(found, l) {
			t.Errorf("%s no longer leaks: remove it from pending", l)
		}
	}
}

// listPublic returns the module's public packages and the export data file
// of every package they depend on.
func listPublic(t *testing.T) ([]string, map[string]string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-export", "-deps", "-json=ImportPath,Export,DepOnly,Standard", module+"/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []string
	exports := map[string]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath, Export string
			DepOnly            bool
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		exports[p.ImportPath] = p.Export
		if !p.DepOnly && isPublic(p.ImportPath) {
			pkgs = append(pkgs, p.ImportPath)
		}
	}
	return pkgs, exports
}

func isPublic(path string) bool {
	rel, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return false
	}
	return !isInternal(path) && !strings.HasPrefix(rel, "cmd/")
}

func isInternal(path string) bool {
	return strings.HasSuffix(path, "/internal") || strings.Contains(path, "/internal/") || strings.HasPrefix(path, "internal/")
}

// leaks lists "pkg.Ident: internal/pkg.Type" for each exported identifier of
// pkg whose API mentions an internal type.
func leaks(pkg *types.Package) []string {
	var out []string
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		w := walker{home: pkg, seen: map[types.Type]bool{}}
		if tn, ok := obj.(*types.TypeName); ok {
			w.typeDecl(tn)
		} else {
			w.walk(obj.Type())
		}
		for _, in := range w.found {
			out = append(out, fmt.Sprintf("%s.%s: %s", strings.TrimPrefix(pkg.Path(), module+"/"), name, in))
		}
	}
	return out
}

type walker struct {
	home  *types.Package
	seen  map[types.Type]bool
	found []string
}

func (w *walker) note(s string) {
	if !slices.Contains(w.found, s) {
		w.found = append(w.found, s)
	}
}

// typeDecl walks what a declared type shows: its underlying type and its
// exported methods.
func (w *walker) typeDecl(tn *types.TypeName) {
	t := tn.Type()
	if tn.IsAlias() {
		w.walk(t)
		return
	}
	w.walk(t.Underlying())
	ms := types.NewMethodSet(types.NewPointer(t))
	for i := range ms.Len() {
		if m := ms.At(i).Obj(); m.Exported() {
			w.walk(m.Type())
		}
	}
}

// walk finds internal named types in t, not entering named types of other
// packages (their own check covers them) nor of home (checked by name).
func (w *walker) walk(t types.Type) {
	if t == nil || w.seen[t] {
		return
	}
	w.seen[t] = true
	switch t := t.(type) {
	case *types.Alias:
		w.walk(types.Unalias(t))
	case *types.Named:
		if p := t.Obj().Pkg(); p != nil && isInternal(p.Path()) {
			w.note(strings.TrimPrefix(p.Path(), module+"/") + "." + t.Obj().Name())
		}
		if args := t.TypeArgs(); args != nil {
			for i := range args.Len() {
				w.walk(args.At(i))
			}
		}
	case *types.Pointer:
		w.walk(t.Elem())
	case *types.Slice:
		w.walk(t.Elem())
	case *types.Array:
		w.walk(t.Elem())
	case *types.Map:
		w.walk(t.Key())
		w.walk(t.Elem())
	case *types.Chan:
		w.walk(t.Elem())
	case *types.Signature:
		w.walk(t.Params())
		w.walk(t.Results())
	case *types.Tuple:
		for i := range t.Len() {
			w.walk(t.At(i).Type())
		}
	case *types.Struct:
		for i := range t.NumFields() {
			if f := t.Field(i); f.Exported() || f.Embedded() {
				w.walk(f.Type())
			}
		}
	case *types.Interface:
		for i := range t.NumMethods() {
			if m := t.Method(i); m.Exported() {
				w.walk(m.Type())
			}
		}
		for i := range t.NumEmbeddeds() {
			w.walk(t.EmbeddedType(i))
		}
	}
}

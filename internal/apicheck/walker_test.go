package apicheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"slices"
	"testing"
)

// typeCheck type-checks src as the package at path, importing from deps.
func typeCheck(t *testing.T, path, src string, deps map[string]*types.Package) *types.Package {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path+".go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	conf := types.Config{Importer: importerFunc(func(p string) (*types.Package, error) {
		if pkg, ok := deps[p]; ok {
			return pkg, nil
		}
		return nil, fmt.Errorf("no package %s", p)
	})}
	pkg, err := conf.Check(path, fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pkg
}

type importerFunc func(string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// The walker finds an internal type wherever an exported identifier shows
// it, and only there: without this, an empty pending list would pass
// whether or not leaks reports anything.
func TestLeaksFindsEveryPlaceAnInternalTypeShows(t *testing.T) {
	in := typeCheck(t, module+"/internal/x", "package x\ntype Secret struct{}\ntype Other int\n", nil)
	pub := typeCheck(t, module+"/pub", `package pub

import "github.com/warmfleet/warmfleet/internal/x"

func Result() *x.Secret { return nil }
func Param(map[string][]x.Secret) {}
var Var chan x.Secret
type Field struct{ F [2]x.Secret }
type Embedded struct{ *x.Secret }
type Method struct{}
func (Method) M() x.Other { return 0 }
type Iface interface{ M(func(x.Secret)) }
type Alias = x.Secret
type Box[T any] struct{ V T }
var Generic Box[x.Secret]

type Clean struct {
	hidden x.Secret
	Shown  int
}
func (Clean) unexported() x.Secret { return x.Secret{} }
func private() x.Secret { return x.Secret{} }
`, map[string]*types.Package{in.Path(): in})
	got := leaks(pub)
	want := []string{
		"pub.Alias: internal/x.Secret",
		"pub.Embedded: internal/x.Secret",
		"pub.Field: internal/x.Secret",
		"pub.Generic: internal/x.Secret",
		"pub.Iface: internal/x.Secret",
		"pub.Method: internal/x.Other",
		"pub.Param: internal/x.Secret",
		"pub.Result: internal/x.Secret",
		"pub.Var: internal/x.Secret",
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("leaks:\n got %q\nwant %q", got, want)
	}
}

package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/spec"
)

// Load reads what `apply -f ARG` names: a file, every *.yaml, *.yml and
// *.json file of a directory (not its subdirectories, in name order), or
// stdin for "-". Names must be unique per kind across everything read, and
// so must keys (two Endpoints with one URL).
func Load(arg string, stdin io.Reader) ([]Object, error) {
	var objs []Object
	add := func(name string, r io.Reader) error {
		o, err := Decode(name, r)
		objs = append(objs, o...)
		return err
	}
	var errs []error
	switch fi, err := os.Stat(arg); {
	case arg == "-":
		errs = append(errs, add("-", stdin))
	case err != nil:
		return nil, fmt.Errorf("read manifests: %w", err)
	case fi.IsDir():
		files, err := manifestFiles(arg)
		if err != nil {
			return nil, err
		}
		for _, p := range files {
			errs = append(errs, loadFile(p, add))
		}
	default:
		errs = append(errs, loadFile(arg, add))
	}
	errs = append(errs, checkUnique(objs))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return objs, nil
}

func manifestFiles(dir string) ([]string, error) {
	out, err := Files(dir)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("read manifests: %s has no *.yaml, *.yml or *.json file", dir)
	}
	return out, nil
}

// Files lists the manifest files of a directory, in name order: its
// *.yaml, *.yml and *.json files, symbolic links to files included, names
// starting with a dot left out. A mounted Kubernetes ConfigMap is such a
// directory: each key is a link into "..data", itself a link to the
// current version's hidden directory, swapped at every update.
func Files(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read manifests: %w", err)
	}
	var out []string
	for _, e := range ents {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if strings.HasPrefix(e.Name(), ".") || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
				continue // dangling, or a link to a directory
			}
		} else if !e.Type().IsRegular() {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// Parse decodes one file's content (Decode) and checks that its names
// and keys are unique, as Load does across everything it reads.
func Parse(name string, data []byte) ([]Object, error) {
	objs, err := Decode(name, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	if err := checkUnique(objs); err != nil {
		return nil, err
	}
	return objs, nil
}

// Split sorts objects into what an apply request carries: the specs of
// caches and the endpoints.
func Split(objs []Object) ([]spec.Spec, []api.Endpoint) {
	var specs []spec.Spec
	var eps []api.Endpoint
	for _, o := range objs {
		if o.Kind == KindEndpoint {
			eps = append(eps, o.Endpoint)
		} else {
			specs = append(specs, o.Spec)
		}
	}
	return specs, eps
}

func loadFile(path string, add func(string, io.Reader) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("read manifests: %w", err)
	}
	defer f.Close()
	return add(path, f)
}

// checkUnique reports names used twice within a kind and keys used twice.
func checkUnique(objs []Object) error {
	var errs []error
	names := map[string]string{}
	keys := map[string]string{}
	for _, o := range objs {
		if o.Name == "" || o.Kind == "" {
			continue
		}
		if prev, ok := names[string(o.Kind)+"/"+o.Name]; ok {
			errs = append(errs, fmt.Errorf("%s: %s %q: duplicate name (first at %s)", o.Pos, o.Kind, o.Name, prev))
			continue
		}
		names[string(o.Kind)+"/"+o.Name] = o.Pos
		if prev, ok := keys[o.Key()]; ok {
			errs = append(errs, fmt.Errorf("%s: %s %q: asks for %s again (first at %s)", o.Pos, o.Kind, o.Name, o.Key(), prev))
			continue
		}
		keys[o.Key()] = o.Pos
	}
	return errors.Join(errs...)
}

// DefaultOwner is the owner recorded on what `apply -f ARG` creates when
// no --owner is given: "file:" or "dir:" and the absolute path. Stdin has
// no name to own by, so "-" needs --owner. A path differs between machines
// and checkouts: a team applying one file from several places gives
// --owner so prune and conflicts see one owner.
func DefaultOwner(arg string) (string, error) {
	if arg == "-" {
		return "", errors.New("apply -f -: stdin has no name to own what it creates by; give --owner")
	}
	abs, err := filepath.Abs(arg)
	if err != nil {
		return "", fmt.Errorf("owner of %s: %w", arg, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("owner of %s: %w", arg, err)
	}
	owner := "file:" + abs
	if fi.IsDir() {
		owner = "dir:" + abs
	}
	return owner, ValidateOwner(owner)
}

// MaxOwnerLen bounds an owner: it travels with every spec in gossip.
const MaxOwnerLen = spec.MaxAppliedByLen

// ValidateOwner checks an owner from outside (--owner, an API body).
func ValidateOwner(owner string) error { return spec.ValidateAppliedBy(owner) }

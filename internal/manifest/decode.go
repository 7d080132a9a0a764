package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/spec"
)

// APIVersion is the only schema version this package reads.
const APIVersion = "warmfleet.io/v1alpha1"

// Kind is a document's kind.
type Kind string

// The kinds of document.
const (
	KindModelCache Kind = "ModelCache"
	KindImageCache Kind = "ImageCache"
	KindEndpoint   Kind = "Endpoint"
)

var kinds = []Kind{KindModelCache, KindImageCache, KindEndpoint}

// Limits on one input, so a wrong file (or a hostile one) gives an error
// instead of an unbounded allocation.
const (
	MaxBytes     = 4 << 20
	MaxDocuments = 1000
)

// Object is one document mapped to the daemon's types.
type Object struct {
	Kind Kind
	// Name is metadata.name.
	Name string
	// Spec is what a ModelCache or ImageCache asks the fleet for.
	Spec spec.Spec
	// Endpoint is what an Endpoint registers on the daemon's node.
	Endpoint api.Endpoint
	// Pos is where the document starts: "file.yaml:12".
	Pos string
}

// Key identifies the object in the daemon's state: the spec's key for
// caches, the URL for endpoints (the daemon keeps one endpoint per URL).
func (o Object) Key() string {
	if o.Kind == KindEndpoint {
		return "endpoint/" + o.Endpoint.URL
	}
	return o.Spec.Key()
}

// Equal reports whether two objects ask the daemon for the same thing.
func (o Object) Equal(p Object) bool {
	if o.Kind != p.Kind {
		return false
	}
	if o.Kind == KindEndpoint {
		return o.Endpoint == p.Endpoint
	}
	return o.Spec.Equal(p.Spec)
}

// FromSpec is the Object of a spec the daemon holds.
func FromSpec(s spec.Spec) Object {
	if s.Kind == spec.KindImage {
		return Object{Kind: KindImageCache, Name: s.Owner, Spec: s}
	}
	return Object{Kind: KindModelCache, Name: s.Name, Spec: s}
}

// FromEndpoint is the Object of an endpoint the daemon holds. The daemon
// does not keep the document's name, so the model stands in for it.
func FromEndpoint(ep api.Endpoint) Object {
	return Object{Kind: KindEndpoint, Name: ep.Model, Endpoint: ep}
}

// Decode reads every document of one input; name (a file name, or "-")
// prefixes each position in errors. Empty documents are skipped. It
// reports every problem it finds, each as "name:line: what".
func Decode(name string, r io.Reader) ([]Object, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%s: longer than %d bytes", name, MaxBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var (
		objs []Object
		errs []error
	)
	for i := 0; ; i++ {
		var doc yaml.Node
		if err := dec.Decode(&doc); err == io.EOF {
			break
		} else if err != nil {
			// The parser cannot resume after a syntax error.
			msg := strings.TrimPrefix(err.Error(), "yaml: ")
			if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
				msg = m[1] + ": " + m[2]
			} else {
				msg = " " + msg
			}
			errs = append(errs, fmt.Errorf("%s:%s", name, msg))
			break
		}
		if i >= MaxDocuments {
			errs = append(errs, fmt.Errorf("%s:%d: more than %d documents", name, doc.Line, MaxDocuments))
			break
		}
		d := &decoder{file: name}
		o, ok := d.document(&doc)
		errs = append(errs, d.sorted()...)
		if ok {
			objs = append(objs, o)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return objs, nil
}

// yamlLineRE picks the line out of the parser's "line 3: ..." errors.
var yamlLineRE = regexp.MustCompile(`^line (\d+): (.*)$`)

// decoder walks one document's node tree against the schema. It never
// recurses beyond the schema's fixed depth, so aliases cannot blow it up.
type decoder struct {
	file string
	errs []lineError
}

type lineError struct {
	line int
	err  error
}

func (d *decoder) errorf(n *yaml.Node, format string, args ...any) {
	d.errs = append(d.errs, lineError{n.Line, fmt.Errorf("%s:%d: %s", d.file, n.Line, fmt.Sprintf(format, args...))})
}

// sorted returns the errors in the order of their lines.
func (d *decoder) sorted() []error {
	slices.SortStableFunc(d.errs, func(a, b lineError) int { return a.line - b.line })
	out := make([]error, len(d.errs))
	for i, e := range d.errs {
		out[i] = e.err
	}
	return out
}

func (d *decoder) pos(n *yaml.Node) string { return fmt.Sprintf("%s:%d", d.file, n.Line) }

// field is one key of a mapping: its key node (for positions) and value.
type field struct{ key, val *yaml.Node }

// mapping returns the keys of a mapping node, checking each against the
// allowed set; path names the mapping in errors ("spec").
func (d *decoder) mapping(n *yaml.Node, path string, allowed ...string) (map[string]field, bool) {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "%s: want a mapping, got %s", path, describe(n))
		return nil, false
	}
	out := make(map[string]field, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, "%s: keys must be strings", path)
			continue
		}
		if prev, dup := out[k.Value]; dup {
			d.errorf(k, "%s.%s: duplicate field (first at line %d)", path, k.Value, prev.key.Line)
			continue
		}
		if allowed != nil && !slices.Contains(allowed, k.Value) {
			d.errorf(k, "%s.%s: unknown field (want one of %s)", path, k.Value, strings.Join(allowed, ", "))
			continue
		}
		out[k.Value] = field{k, v}
	}
	return out, true
}

// str reads a scalar as the text written: "1.10" stays "1.10", "no" stays
// "no". Nulls, sequences and mappings are errors.
func (d *decoder) str(f field, path string) string {
	v := deref(f.val)
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		d.errorf(f.key, "%s: want a string, got %s", path, describe(v))
		return ""
	}
	return v.Value
}

func (d *decoder) integer(f field, path string) int {
	v := deref(f.val)
	var n int
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || v.Decode(&n) != nil {
		d.errorf(f.key, "%s: want an integer, got %s", path, describe(v))
	}
	return n
}

// number is a YAML integer or float; NaN and the infinities are refused
// here, since a range check passes NaN.
func (d *decoder) number(f field, path string) float64 {
	v := deref(f.val)
	var x float64
	if v.Kind != yaml.ScalarNode || (v.Tag != "!!int" && v.Tag != "!!float") || v.Decode(&x) != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		d.errorf(f.key, "%s: want a number, got %s", path, describe(v))
	}
	return x
}

func (d *decoder) boolean(f field, path string) bool {
	v := deref(f.val)
	var b bool
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&b) != nil {
		d.errorf(f.key, "%s: want true or false, got %s", path, describe(v))
	}
	return b
}

func (d *decoder) labels(f field, path string) map[string]string {
	fs, ok := d.mapping(f.val, path)
	if !ok {
		return nil
	}
	out := make(map[string]string, len(fs))
	for _, k := range slices.Sorted(maps.Keys(fs)) {
		out[k] = d.str(fs[k], path+"."+k)
	}
	return out
}

func deref(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}

// endpointNameRE is what an Endpoint's name may be; the daemon does not
// keep it, it only tells documents apart.
var endpointNameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)

// document maps one document; ok is false when it is empty or broken.
func (d *decoder) document(doc *yaml.Node) (Object, bool) {
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	if doc.Kind == 0 || doc.Kind == yaml.DocumentNode || doc.Kind == yaml.ScalarNode && doc.Tag == "!!null" {
		return Object{}, false
	}
	nerr := len(d.errs)
	top, ok := d.mapping(doc, "document", "apiVersion", "kind", "metadata", "spec")
	if !ok {
		return Object{}, false
	}
	o := Object{Pos: d.pos(doc)}
	for _, req := range []string{"apiVersion", "kind", "metadata", "spec"} {
		if _, ok := top[req]; !ok {
			d.errorf(doc, "%s is required", req)
		}
	}
	if f, ok := top["apiVersion"]; ok {
		if v := d.str(f, "apiVersion"); v != APIVersion && v != "" {
			d.errorf(f.val, "apiVersion %q: want %q", v, APIVersion)
		}
	}
	if f, ok := top["kind"]; ok {
		o.Kind = Kind(d.str(f, "kind"))
		if !slices.Contains(kinds, o.Kind) && o.Kind != "" {
			d.errorf(f.val, "kind %q: want one of %s, %s, %s", o.Kind, KindModelCache, KindImageCache, KindEndpoint)
			o.Kind = ""
		}
	}
	if f, ok := top["metadata"]; ok {
		if md, ok := d.mapping(f.val, "metadata", "name"); ok {
			if nf, ok := md["name"]; ok {
				o.Name = d.str(nf, "metadata.name")
			} else {
				d.errorf(f.key, "metadata.name is required")
			}
		}
	}
	if f, ok := top["spec"]; ok && o.Kind != "" {
		d.spec(&o, f)
	}
	return o, len(d.errs) == nerr
}

// spec maps a document's spec to the daemon's types and checks it with
// the validators the API uses, so a file and the CLI accept the same things.
func (d *decoder) spec(o *Object, f field) {
	nerr := len(d.errs)
	var verr error
	switch o.Kind {
	case KindModelCache:
		fs, ok := d.mapping(f.val, "spec", "source", "revision", "selector", "nodes", "pin", "priority")
		if !ok {
			return
		}
		s := spec.Spec{Kind: spec.KindModel, Name: o.Name}
		d.str2(fs, "source", &s.Source)
		d.str2(fs, "revision", &s.Revision)
		d.targets(fs, &s.Targets)
		if p, ok := fs["pin"]; ok {
			s.Pin = d.boolean(p, "spec.pin")
		}
		if p, ok := fs["priority"]; ok {
			s.Priority = d.integer(p, "spec.priority")
		}
		o.Spec, verr = s, s.Validate()
	case KindImageCache:
		fs, ok := d.mapping(f.val, "spec", "image", "selector", "nodes")
		if !ok {
			return
		}
		s := spec.Spec{Kind: spec.KindImage, Owner: o.Name}
		if _, ok := fs["image"]; !ok {
			d.errorf(f.key, "spec.image is required")
			return
		}
		d.str2(fs, "image", &s.Name)
		d.targets(fs, &s.Targets)
		o.Spec, verr = s, s.Validate()
	case KindEndpoint:
		fs, ok := d.mapping(f.val, "spec", "model", "url", "speed")
		if !ok {
			return
		}
		d.str2(fs, "model", &o.Endpoint.Model)
		d.str2(fs, "url", &o.Endpoint.URL)
		if f, ok := fs["speed"]; ok {
			o.Endpoint.Speed = d.number(f, "spec.speed")
		}
		verr = o.Endpoint.Validate()
		if !endpointNameRE.MatchString(o.Name) {
			verr = errors.Join(fmt.Errorf("name %q: want 1 to 63 letters, digits, '.', '_', '-'", o.Name), verr)
		}
	}
	if verr != nil && len(d.errs) == nerr {
		// The validators' messages would repeat a type error in other words.
		for _, e := range unjoin(verr) {
			d.errorf(f.key, "%s: %v", o.Kind, e)
		}
	}
}

func (d *decoder) str2(fs map[string]field, key string, dst *string) {
	if f, ok := fs[key]; ok {
		*dst = d.str(f, "spec."+key)
	}
}

func (d *decoder) targets(fs map[string]field, t *spec.Targets) {
	if f, ok := fs["selector"]; ok {
		t.Selector = d.labels(f, "spec.selector")
	}
	if f, ok := fs["nodes"]; ok {
		t.Nodes = d.integer(f, "spec.nodes")
	}
}

// unjoin splits an errors.Join result so each problem gets its own line.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	return []error{err}
}

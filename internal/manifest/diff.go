package manifest

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Diff writes the plan for a person: one block per change ("+" create,
// "~" update, "-" delete) with the fields it sets, changes or drops, then a
// summary line (for a delete, also how many named objects were not held).
func (p Plan) Diff(w io.Writer) error {
	var b strings.Builder
	var n [3]int
	for _, c := range p.Changes {
		switch c.Action {
		case Create:
			n[0]++
			block(&b, "+", c.New)
		case Update:
			n[1]++
			fmt.Fprintf(&b, "~ %s\n", title(c.New))
			old := fields(c.Old)
			for i, f := range fields(c.New) {
				if o := old[i].v; o != f.v {
					fmt.Fprintf(&b, "    %s: %s -> %s\n", f.k, orNone(o), orNone(f.v))
				}
			}
			if c.OldOwner != p.Owner {
				fmt.Fprintf(&b, "    owner: %s -> %s\n", ownerText(c.OldOwner), p.Owner)
			}
		case Delete:
			n[2]++
			block(&b, "-", c.Old)
		}
	}
	missing := ""
	if p.Missing > 0 {
		missing = fmt.Sprintf(", %d not held", p.Missing)
	}
	fmt.Fprintf(&b, "%d to create, %d to update, %d to delete, %d unchanged%s (owner %s)\n", n[0], n[1], n[2], p.Unchanged, missing, p.Owner)
	_, err := io.WriteString(w, b.String())
	return err
}

// block writes an object whole: its title and every field it sets.
func block(b *strings.Builder, sign string, o Object) {
	fmt.Fprintf(b, "%s %s\n", sign, title(o))
	for _, f := range fields(o) {
		if f.v != "" {
			fmt.Fprintf(b, "    %s: %s\n", f.k, f.v)
		}
	}
}

func title(o Object) string {
	if o.Kind == KindEndpoint {
		return "Endpoint " + o.Endpoint.URL
	}
	return string(o.Kind) + " " + o.Name
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func ownerText(o string) string {
	if o == "" {
		return "(made by hand)"
	}
	return o
}

type kv struct{ k, v string }

// fields lists an object's settings in a fixed order per kind, empty
// values for unset ones, so two lists of one kind line up.
func fields(o Object) []kv {
	switch o.Kind {
	case KindEndpoint:
		speed := ""
		if o.Endpoint.Speed != 0 {
			speed = strconv.FormatFloat(o.Endpoint.Speed, 'g', -1, 64)
		}
		return []kv{{"model", o.Endpoint.Model}, {"url", o.Endpoint.URL}, {"speed", speed}}
	case KindImageCache:
		return []kv{{"image", o.Spec.Name}, {"selector", selector(o.Spec.Targets.Selector)}, {"nodes", nodes(o.Spec.Targets.Nodes)}}
	default:
		return []kv{{"source", o.Spec.Source}, {"revision", o.Spec.Revision},
			{"selector", selector(o.Spec.Targets.Selector)}, {"nodes", nodes(o.Spec.Targets.Nodes)},
			{"pin", pin(o.Spec.Pin)}, {"priority", nodes(o.Spec.Priority)}}
	}
}

func selector(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

func pin(p bool) string {
	if p {
		return "true"
	}
	return ""
}

// nodes writes a count or a priority; 0, the default, as nothing.
func nodes(n int) string {
	if n == 0 {
		return ""
	}
	return strconv.Itoa(n)
}

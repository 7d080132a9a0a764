package daemon

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// A source whose file set changes (an object deleted or added, say while
// a download runs) is a new revision only when the listing is stable: a
// listing whose paths differ from the cached or fetched ones is recorded
// and acted upon only when the next listing, at the next attempt after the
// retry backoff, agrees with it. A replace done as delete-then-upload, or
// a listing caught half way through an upload, thus never publishes a
// revision short of a file. The status reports the change (which files
// went and came) and whether it is confirmed.

// errFileSetChanged fails an attempt whose listing awaits confirmation.
var errFileSetChanged = errors.New("the source's file set changed")

// listingVerdict is what judgeListing decided.
type listingVerdict struct {
	// accept: go on with this listing.
	accept bool
	// record: store listing and change in the cache record.
	record  bool
	listing string
	change  *api.FileSetChange
}

// judgeListing decides whether a listing may be acted upon, given the
// cache's record: always when nothing was cached or fetched before or the
// source moved (another file set is then expected); when the file set is
// the recorded one; and when it differs but the previous attempt saw the
// same listing. It is pure, so every rule is a table test.
func judgeListing(rec cacheRecord, s spec.Spec, objs []origin.Object, now time.Time) listingVerdict {
	if len(rec.Files) == 0 || rec.Spec.Source != s.Source {
		return listingVerdict{accept: true, record: rec.Listing != "", change: rec.FilesChanged}
	}
	gone, came := fileSetDiff(rec.Files, objs)
	if len(gone) == 0 && len(came) == 0 {
		if rec.Listing == "" {
			return listingVerdict{accept: true, change: rec.FilesChanged}
		}
		// The change was not confirmed: the files came back. Forget it.
		change := rec.FilesChanged
		if change != nil && !change.Confirmed {
			change = nil
		}
		return listingVerdict{accept: true, record: true, change: change}
	}
	listing := RevisionID("", objs)
	if rec.Listing == listing {
		return listingVerdict{accept: true, record: true, change: &api.FileSetChange{Gone: gone, Came: came, Confirmed: true, At: now}}
	}
	return listingVerdict{record: true, listing: listing, change: &api.FileSetChange{Gone: gone, Came: came, At: now}}
}

// fileSetDiff lists the paths that went from old and came in objs, sorted.
func fileSetDiff(old []fileRecord, objs []origin.Object) (gone, came []string) {
	had := make(map[string]bool, len(old))
	for _, f := range old {
		had[f.Path] = true
	}
	has := make(map[string]bool, len(objs))
	for _, o := range objs {
		has[o.Path] = true
		if !had[o.Path] {
			came = append(came, o.Path)
		}
	}
	for _, f := range old {
		if !has[f.Path] {
			gone = append(gone, f.Path)
		}
	}
	slices.Sort(gone)
	slices.Sort(came)
	return gone, came
}

// describeChange says what went and came, for errors and logs.
func describeChange(c *api.FileSetChange) string {
	if c == nil {
		return "no change"
	}
	var parts []string
	if len(c.Gone) > 0 {
		parts = append(parts, fmt.Sprintf("%d gone (%s)", len(c.Gone), strings.Join(first(c.Gone, 5), ", ")))
	}
	if len(c.Came) > 0 {
		parts = append(parts, fmt.Sprintf("%d new (%s)", len(c.Came), strings.Join(first(c.Came, 5), ", ")))
	}
	return strings.Join(parts, ", ")
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(slices.Clone(s[:n]), "...")
	}
	return s
}

package hforigin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/spec"
)

var (
	commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ListHF resolves src's revision to a commit and returns every file under
// src's subdir at that commit that the Include/Exclude patterns keep,
// sorted by path. Each Object has Bucket = the repository, Key = the path
// in the repository, Path = the path under the subdir, ETag = the file's
// sha256 (LFS, 64 hex digits) or git blob id (40 hex digits) and VersionID
// = the commit every read is pinned to. It fails on an empty result and on
// any name that is not a safe relative path, naming it.
func (c *Client) ListHF(ctx context.Context, src spec.HFURL) ([]s3origin.Object, error) {
	what := "list " + src.String()
	commit, err := c.ResolveRevision(ctx, src)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err) // every List error names the listing
	}
	next := c.opts.Endpoint + "/api/models/" + src.Repo + "/tree/" + commit
	if src.Subdir != "" {
		next += "/" + escapePath(src.Subdir)
	}
	next += "?recursive=true"
	var entries []treeEntry
	for page := 0; next != ""; page++ {
		if page >= MaxPages {
			return nil, fmt.Errorf("%s: %w: more than %d pages of files", what, s3origin.ErrServer, MaxPages)
		}
		body, hdr, err := c.apiGet(ctx, next, src.Repo, what)
		if err != nil {
			return nil, err
		}
		got, err := decodeTreePage(body, len(entries), MaxFiles)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		entries = append(entries, got...)
		if next, err = c.nextPage(next, hdr.Values("Link")); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
	return objectsFromTree(src, commit, entries, c.opts.Include, c.opts.Exclude)
}

// ResolveRevision asks the Hub which commit src's revision names now.
func (c *Client) ResolveRevision(ctx context.Context, src spec.HFURL) (string, error) {
	what := "resolve " + src.String()
	body, _, err := c.apiGet(ctx, c.opts.Endpoint+"/api/models/"+src.Repo+"/revision/"+url.PathEscape(src.Revision), src.Repo, what)
	if err != nil {
		return "", err
	}
	commit, err := decodeModelInfo(body)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if commitRE.MatchString(src.Revision) && commit != src.Revision {
		return "", fmt.Errorf("%s: %w: asked for commit %s, the Hub answered %s", what, s3origin.ErrServer, src.Revision, commit)
	}
	return commit, nil
}

// escapePath escapes each segment of a slash-separated path.
func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

// apiGet GETs an API document, retrying throttling and server errors, and
// reads at most MaxAPIBody bytes of it.
func (c *Client) apiGet(ctx context.Context, u, repo, what string) (body []byte, hdr http.Header, err error) {
	err = c.retrier(repo, "retrying Hub request").Do(ctx, what, func() error {
		body, hdr, err = c.apiGetOnce(ctx, u)
		return err
	})
	return body, hdr, err
}

func (c *Client) apiGetOnce(ctx context.Context, u string) ([]byte, http.Header, error) {
	req, err := c.newRequest(ctx, http.MethodGet, u)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.api.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, newStatusError(resp, time.Now())
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxAPIBody+1))
	if err != nil {
		return nil, nil, err
	}
	if len(body) > MaxAPIBody {
		return nil, nil, fmt.Errorf("%w: an API answer longer than %d bytes", s3origin.ErrServer, MaxAPIBody)
	}
	return body, resp.Header, nil
}

// nextPage finds the rel="next" URL in Link headers, resolved against the
// page's URL. It must stay on the Hub's host (the token goes there) and
// must not repeat the page.
func (c *Client) nextPage(cur string, links []string) (string, error) {
	for _, l := range links {
		for part := range strings.SplitSeq(l, ",") {
			target, params, ok := strings.Cut(strings.TrimSpace(part), ";")
			if !ok || !strings.Contains(strings.ReplaceAll(params, " ", ""), `rel="next"`) {
				continue
			}
			target = strings.TrimSpace(target)
			if !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				return "", fmt.Errorf("%w: bad Link header %q", s3origin.ErrServer, l)
			}
			base, _ := url.Parse(cur)
			u, err := base.Parse(target[1 : len(target)-1])
			if err != nil || u.Host != c.hubHost || (u.Scheme != "http" && u.Scheme != "https") {
				return "", fmt.Errorf("%w: next page %q is not on %s", s3origin.ErrServer, target, c.hubHost)
			}
			if u.String() == cur {
				return "", fmt.Errorf("%w: the next page is the same page", s3origin.ErrServer)
			}
			return u.String(), nil
		}
	}
	return "", nil
}

// decodeModelInfo returns the commit of a model-info document.
func decodeModelInfo(body []byte) (string, error) {
	var info struct {
		SHA *string `json:"sha"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return "", fmt.Errorf("%w: model info: %w", s3origin.ErrServer, err)
	}
	if info.SHA == nil || !commitRE.MatchString(*info.SHA) {
		return "", fmt.Errorf("%w: model info has no commit sha (40 hex digits)", s3origin.ErrServer)
	}
	return *info.SHA, nil
}

// treeEntry is one entry of a tree page. Fields the Hub adds (xetHash,
// lastCommit, ...) are ignored.
type treeEntry struct {
	Type string `json:"type"`
	Path string `json:"path"`
	Size int64  `json:"size"`
	OID  string `json:"oid"`
	LFS  *struct {
		OID  string `json:"oid"`
		Size int64  `json:"size"`
	} `json:"lfs"`
}

// decodeTreePage decodes one page of a tree listing: a JSON array and
// nothing after it. With listed entries from earlier pages it refuses entry
// limit+1 of the listing before decoding it, so a hostile page costs no more
// than the entries we keep.
func decodeTreePage(body []byte, listed, limit int) ([]treeEntry, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, fmt.Errorf("%w: tree page is not a list", s3origin.ErrServer)
	}
	entries := []treeEntry{}
	for dec.More() {
		if listed+len(entries) == limit {
			return nil, fmt.Errorf("%w: more than %d entries", s3origin.ErrServer, limit)
		}
		var e treeEntry
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("%w: tree page: %w", s3origin.ErrServer, err)
		}
		entries = append(entries, e)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%w: tree page: %w", s3origin.ErrServer, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: tree page: data after the list", s3origin.ErrServer)
	}
	return entries, nil
}

// objectsFromTree turns a listing into Objects: it keeps files under the
// subdir that the patterns keep, checks every name and digest, and rejects
// paths that clash. A plain function, so hostile listings are tested
// without a server.
func objectsFromTree(src spec.HFURL, commit string, entries []treeEntry, include, exclude []string) ([]s3origin.Object, error) {
	what := "list " + src.String()
	prefix := ""
	if src.Subdir != "" {
		prefix = src.Subdir + "/"
	}
	all := make([]s3origin.Object, 0, len(entries))
	for _, e := range entries {
		switch e.Type {
		case "directory":
			continue
		case "file":
		default:
			return nil, fmt.Errorf("%s: %w: entry %q has type %q", what, s3origin.ErrServer, e.Path, e.Type)
		}
		rel, ok := strings.CutPrefix(e.Path, prefix)
		if !ok {
			return nil, fmt.Errorf("%s: %w: file %q is outside %q", what, s3origin.ErrUnsafeKey, e.Path, src.Subdir)
		}
		if err := s3origin.ValidRelPath(rel); err != nil {
			return nil, fmt.Errorf("%s: file %q: %w", what, e.Path, err)
		}
		if e.Size < 0 || e.Size > s3origin.MaxObjectSize {
			return nil, fmt.Errorf("%s: %w: file %q has size %d", what, s3origin.ErrServer, e.Path, e.Size)
		}
		digest := e.OID
		if e.LFS != nil {
			digest = e.LFS.OID
			if !sha256RE.MatchString(digest) || e.LFS.Size != e.Size {
				return nil, fmt.Errorf("%s: %w: LFS file %q: want a sha256 oid and its size (%q, %d bytes, %d listed)",
					what, s3origin.ErrServer, e.Path, digest, e.LFS.Size, e.Size)
			}
		} else if !commitRE.MatchString(digest) {
			return nil, fmt.Errorf("%s: %w: file %q: oid %q is not a git blob id", what, s3origin.ErrServer, e.Path, digest)
		}
		all = append(all, s3origin.Object{Bucket: src.Repo, Key: e.Path, Path: rel, Size: e.Size, ETag: digest, VersionID: commit})
	}
	// Every listed file, kept or not: the commit must make sense as a tree.
	if err := s3origin.CheckPathClashes(all); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var objs []s3origin.Object
	for _, o := range all {
		if keep(o.Path, include, exclude) {
			objs = append(objs, o)
		}
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s: %w at commit %s (%d files listed before --include/--exclude)", what, s3origin.ErrEmpty, commit, len(all))
	}
	return objs, nil
}

// keep applies the Include and Exclude patterns to a path under the
// subdir, as a daemon's spec applies its own.
func keep(rel string, include, exclude []string) bool { return spec.MatchFiles(rel, include, exclude) }

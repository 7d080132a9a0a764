// Package hubserver is a Hugging Face Hub for tests: an httptest server
// speaking the endpoints hforigin uses, as huggingface_hub and
// huggingface.js call them, and a second httptest server playing the CDN
// that LFS files redirect to. It holds repositories in memory, with
// branches that move, gated repositories, and knobs that make it fail the
// ways the real Hub does (429 with Retry-After, expired CDN addresses,
// bytes that do not match their sha256).
//
// Endpoints (Hub):
//
//	GET  /api/models/{org}/{name}/revision/{rev}         model info: {"id", "sha", "siblings": [{"rfilename"}]}
//	GET  /api/models/{org}/{name}/tree/{rev}[/{path}]    [{type, path, size, oid, lfs: {oid, size, pointerSize}}], pages linked by Link: <...>; rel="next"
//	HEAD|GET /{org}/{name}/resolve/{rev}/{path}          small files served with ETag = git blob id; LFS files 302 to the CDN
//	                                                     with X-Linked-Etag (sha256), X-Linked-Size; X-Repo-Commit on both
//
// Endpoints (CDN): GET /blobs/{sha256}, with Range.
//
// It is test support: only tests and the lab's benchmarks import it.
package hubserver

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// File is one file pushed to a repository.
type File struct {
	Data []byte
	// LFS stores the file in LFS: listed with its sha256, served by the CDN.
	LFS bool
}

// Stats counts requests, for tests to check what a client did.
type Stats struct {
	API, Resolves, CDNGets int
	// CDNAuthorized counts CDN requests that carried an Authorization
	// header: a token leaked off the Hub's host.
	CDNAuthorized int
}

// Server is a Hub and its CDN.
type Server struct {
	Hub, CDN *httptest.Server
	// PageSize is the number of entries per tree page (default 1000).
	PageSize int

	mu       sync.Mutex
	repos    map[string]*repo
	blobs    map[string][]byte // CDN content by sha256
	pushes   int
	throttle int
	after    string
	expire   int
	stats    Stats
}

type repo struct {
	token   string
	refs    map[string]string // branch or tag -> commit
	commits map[string]map[string]stored
}

// stored is a pushed file with its digests, taken once at Push: hashing a
// large file on every listing or resolve would make the server, not the
// client, what a benchmark measures.
type stored struct {
	File
	blobID  string // git blob id of the content
	sha256  string
	pointer []byte // the LFS pointer, for an LFS file
}

// New starts a Hub and a CDN on loopback, closed when t ends.
func New(t testing.TB) *Server { return NewOn(t, nil, nil) }

// NewOn is New serving the Hub on hubLn and the CDN on cdnLn (a netns
// host's listeners, say, for daemons on other hosts to reach); a nil one
// listens on loopback.
func NewOn(t testing.TB, hubLn, cdnLn net.Listener) *Server {
	s := Start(hubLn, cdnLn)
	t.Cleanup(s.Close)
	return s
}

// Start is NewOn for a caller without a test (a benchmark): Close it.
func Start(hubLn, cdnLn net.Listener) *Server {
	s := &Server{repos: map[string]*repo{}, blobs: map[string][]byte{}, PageSize: 1000}
	api := http.NewServeMux()
	api.HandleFunc("GET /api/models/{org}/{name}/revision/{rev}", s.modelInfo)
	api.HandleFunc("GET /api/models/{org}/{name}/tree/{rev}", s.tree)
	api.HandleFunc("GET /api/models/{org}/{name}/tree/{rev}/{path...}", s.tree)
	files := http.NewServeMux()
	files.HandleFunc("GET /{org}/{name}/resolve/{rev}/{path...}", s.resolve)
	s.Hub = start(hubLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/") {
			api.ServeHTTP(w, r)
		} else {
			files.ServeHTTP(w, r)
		}
	}))
	s.CDN = start(cdnLn, http.HandlerFunc(s.cdn))
	return s
}

// Close stops the Hub and the CDN.
func (s *Server) Close() { s.Hub.Close(); s.CDN.Close() }

// start serves h on ln, or on loopback when ln is nil.
func start(ln net.Listener, h http.Handler) *httptest.Server {
	if ln == nil {
		return httptest.NewServer(h)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	return srv
}

// Endpoint is the Hub's base URL (what HF_ENDPOINT would hold).
func (s *Server) Endpoint() string { return s.Hub.URL }

// GitBlobID is the git object id of a file's content.
func GitBlobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// SHA256 is the hex sha256 of data: an LFS file's oid.
func SHA256(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Push commits files (the whole tree of the new commit) to repo (created
// if new) and moves branch to it. It returns the commit id.
func (s *Server) Push(repoID, branch string, files map[string]File) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.repos[repoID]
	if r == nil {
		r = &repo{refs: map[string]string{}, commits: map[string]map[string]stored{}}
		s.repos[repoID] = r
	}
	s.pushes++
	h := sha1.New()
	fmt.Fprintf(h, "%s %d", repoID, s.pushes)
	tree := map[string]stored{}
	for p, f := range files {
		f.Data = bytes.Clone(f.Data)
		st := stored{File: f, blobID: GitBlobID(f.Data), sha256: SHA256(f.Data)}
		fmt.Fprintf(h, "%s %s\n", p, st.blobID)
		if f.LFS {
			st.pointer = fmt.Appendf(nil, "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", st.sha256, len(f.Data))
			s.blobs[st.sha256] = f.Data
		}
		tree[p] = st
	}
	commit := hex.EncodeToString(h.Sum(nil))
	r.commits[commit] = tree
	r.refs[branch] = commit
	return commit
}

// Tag points tag (or a branch) of repo at commit.
func (s *Server) Tag(repoID, tag, commit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repoID].refs[tag] = commit
}

// Gate makes repo need "Authorization: Bearer token": 401 without a token,
// 403 with another one, as the Hub answers for gated repositories.
func (s *Server) Gate(repoID, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repoID].token = token
}

// CorruptCDN makes the CDN serve data for the LFS blob with sha256 oid:
// what a bad cache or a tampering proxy would do.
func (s *Server) CorruptCDN(oid string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blobs[oid] = bytes.Clone(data)
}

// Throttle makes the next n Hub requests answer 429 with the given
// Retry-After header (empty for none).
func (s *Server) Throttle(n int, retryAfter string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttle, s.after = n, retryAfter
}

// ExpireCDN makes the next n CDN requests answer 403, as the CDN does when
// a signed address has expired.
func (s *Server) ExpireCDN(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire = n
}

// Stats returns the request counts so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// lookup finds the repository and commit a request names, applying the
// throttle and the gate. It writes the error answer and returns ok false
// when there is none.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (commit string, tree map[string]stored, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.throttle > 0 {
		s.throttle--
		if s.after != "" {
			w.Header().Set("Retry-After", s.after)
		}
		hubError(w, http.StatusTooManyRequests, "", "rate limited")
		return "", nil, false
	}
	rp := s.repos[r.PathValue("org")+"/"+r.PathValue("name")]
	if rp == nil {
		hubError(w, http.StatusUnauthorized, "RepoNotFound", "Repository not found")
		return "", nil, false
	}
	if rp.token != "" {
		switch auth := r.Header.Get("Authorization"); auth {
		case "Bearer " + rp.token:
		case "":
			hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to this model is restricted. You must be authenticated.")
			return "", nil, false
		default:
			hubError(w, http.StatusForbidden, "GatedRepo", "Access to this model is restricted and you are not in the authorized list.")
			return "", nil, false
		}
	}
	rev := r.PathValue("rev")
	commit, found := rp.refs[rev]
	if !found {
		if _, isCommit := rp.commits[rev]; isCommit {
			commit = rev
		} else {
			hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
			return "", nil, false
		}
	}
	return commit, rp.commits[commit], true
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func (s *Server) count(f func(*Stats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.stats)
}

func (s *Server) modelInfo(w http.ResponseWriter, r *http.Request) {
	s.count(func(st *Stats) { st.API++ })
	commit, tree, ok := s.lookup(w, r)
	if !ok {
		return
	}
	type sibling struct {
		RFilename string `json:"rfilename"`
	}
	info := struct {
		ID       string    `json:"id"`
		SHA      string    `json:"sha"`
		Siblings []sibling `json:"siblings"`
	}{ID: r.PathValue("org") + "/" + r.PathValue("name"), SHA: commit, Siblings: []sibling{}}
	for _, p := range sortedPaths(tree) {
		info.Siblings = append(info.Siblings, sibling{p})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(info)
}

func sortedPaths(tree map[string]stored) []string { return slices.Sorted(maps.Keys(tree)) }

type lfsInfo struct {
	OID         string `json:"oid"`
	Size        int    `json:"size"`
	PointerSize int    `json:"pointerSize"`
}

type entry struct {
	Type string   `json:"type"`
	OID  string   `json:"oid"`
	Size int      `json:"size"`
	Path string   `json:"path"`
	LFS  *lfsInfo `json:"lfs,omitempty"`
}

func (s *Server) tree(w http.ResponseWriter, r *http.Request) {
	s.count(func(st *Stats) { st.API++ })
	_, tree, ok := s.lookup(w, r)
	if !ok {
		return
	}
	dir := strings.Trim(r.PathValue("path"), "/")
	var all []entry
	dirs := map[string]bool{}
	for _, p := range sortedPaths(tree) {
		if dir != "" && !strings.HasPrefix(p, dir+"/") {
			continue
		}
		// Directories come first in their parent, as the Hub lists them.
		for i := strings.IndexByte(p, '/'); i >= 0; i = next(p, i) {
			if d := p[:i]; !dirs[d] && (dir == "" || strings.HasPrefix(d, dir+"/")) {
				dirs[d] = true
				all = append(all, entry{Type: "directory", OID: GitBlobID([]byte(d)), Path: d})
			}
		}
		f := tree[p]
		e := entry{Type: "file", OID: f.blobID, Size: len(f.Data), Path: p}
		if f.LFS {
			e.OID = GitBlobID(f.pointer)
			e.LFS = &lfsInfo{OID: f.sha256, Size: len(f.Data), PointerSize: len(f.pointer)}
		}
		all = append(all, e)
	}
	if dir != "" && len(all) == 0 {
		hubError(w, http.StatusNotFound, "EntryNotFound", "no such path: "+dir)
		return
	}
	cursor, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
	cursor = min(max(cursor, 0), len(all))
	end := min(cursor+max(s.PageSize, 1), len(all))
	if end < len(all) {
		q := r.URL.Query()
		q.Set("cursor", strconv.Itoa(end))
		w.Header().Set("Link", fmt.Sprintf(`<%s%s?%s>; rel="next"`, s.Hub.URL, r.URL.EscapedPath(), q.Encode()))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(all[cursor:end])
}

func next(p string, i int) int {
	j := strings.IndexByte(p[i+1:], '/')
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	s.count(func(st *Stats) { st.Resolves++ })
	commit, tree, ok := s.lookup(w, r)
	if !ok {
		return
	}
	f, found := tree[r.PathValue("path")]
	if !found {
		hubError(w, http.StatusNotFound, "EntryNotFound", "Entry not found")
		return
	}
	w.Header().Set("X-Repo-Commit", commit)
	if !f.LFS {
		w.Header().Set("ETag", `"`+f.blobID+`"`)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.Data))
		return
	}
	oid := f.sha256
	w.Header().Set("X-Linked-Etag", `"`+oid+`"`)
	w.Header().Set("X-Linked-Size", strconv.Itoa(len(f.Data)))
	w.Header().Set("ETag", `"`+GitBlobID(f.pointer)+`"`)
	w.Header().Set("Location", s.CDN.URL+"/blobs/"+oid+"?Expires=9999999999&Signature=test")
	w.WriteHeader(http.StatusFound)
}

func (s *Server) cdn(w http.ResponseWriter, r *http.Request) {
	oid, ok := strings.CutPrefix(r.URL.Path, "/blobs/")
	s.mu.Lock()
	s.stats.CDNGets++
	if r.Header.Get("Authorization") != "" {
		s.stats.CDNAuthorized++
	}
	data, found := s.blobs[oid]
	expired := s.expire > 0
	if expired {
		s.expire--
	}
	s.mu.Unlock()
	switch {
	case expired:
		http.Error(w, "Request has expired", http.StatusForbidden)
	case !ok || !found:
		http.Error(w, "no such blob", http.StatusNotFound)
	default:
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}
}

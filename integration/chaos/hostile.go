package chaos

import (
	"encoding/xml"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// hostileS3 is an S3 front that answers the listings of chosen prefixes
// itself, with keys a real server cannot or would not store (../, absolute,
// backslashes, overlong segments, duplicates, keys outside the prefix, a
// continuation token that loops), and passes every other request to the
// real server. The daemon must reject such a listing before it reads or
// writes anything.
type hostileS3 struct {
	rp *httputil.ReverseProxy

	mu       sync.Mutex
	listings map[string]hostileListing // by prefix
	served   int
}

// hostileListing is what a listing of one prefix returns.
type hostileListing struct {
	Keys []string
	// Loop answers every page as truncated with the same continuation
	// token.
	Loop bool
}

func newHostileS3(target string) (*hostileS3, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	// Keep the client's Host header: SigV4 signs it.
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(u)
		r.Out.Host = r.In.Host
	}}
	return &hostileS3{rp: rp, listings: map[string]hostileListing{}}, nil
}

func hostileFront(target string) (http.Handler, error) { return newHostileS3(target) }

// set makes the listing of prefix return l.
func (h *hostileS3) set(prefix string, l hostileListing) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.listings[prefix] = l
}

// listingsServed counts the hostile listings answered.
func (h *hostileS3) listingsServed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.served
}

type listBucketResult struct {
	XMLName               xml.Name      `xml:"http://s3.amazonaws.com/doc/2006-03-01/ ListBucketResult"`
	Name                  string        `xml:"Name"`
	Prefix                string        `xml:"Prefix"`
	KeyCount              int           `xml:"KeyCount"`
	MaxKeys               int           `xml:"MaxKeys"`
	IsTruncated           bool          `xml:"IsTruncated"`
	NextContinuationToken string        `xml:"NextContinuationToken,omitempty"`
	Contents              []listContent `xml:"Contents"`
}

type listContent struct {
	Key          string `xml:"Key"`
	LastModified string `xml:"LastModified"`
	ETag         string `xml:"ETag"`
	Size         int64  `xml:"Size"`
	StorageClass string `xml:"StorageClass"`
}

func (h *hostileS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.Method != http.MethodGet || q.Get("list-type") != "2" {
		h.rp.ServeHTTP(w, r)
		return
	}
	h.mu.Lock()
	l, ok := h.listings[q.Get("prefix")]
	if ok {
		h.served++
	}
	h.mu.Unlock()
	if !ok {
		h.rp.ServeHTTP(w, r)
		return
	}
	res := listBucketResult{
		Name: strings.Trim(r.URL.Path, "/"), Prefix: q.Get("prefix"), KeyCount: len(l.Keys), MaxKeys: 1000,
		IsTruncated: l.Loop,
	}
	if l.Loop {
		res.NextContinuationToken = "loop"
	}
	for _, k := range l.Keys {
		res.Contents = append(res.Contents, listContent{
			Key: k, LastModified: time.Unix(1<<30, 0).UTC().Format("2006-01-02T15:04:05.000Z"),
			ETag: `"d41d8cd98f00b204e9800998ecf8427e"`, Size: 1 << 20, StorageClass: "STANDARD",
		})
	}
	body, err := xml.Marshal(res)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/xml")
	_, _ = w.Write(append([]byte(xml.Header), body...))
}

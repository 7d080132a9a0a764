package s3origin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/spec"
)

// lyingProxy sits in front of the real gateway and rewrites its answers the
// way a broken or hostile S3-compatible server would. The requests are
// passed on unchanged (with their Host), so signatures still verify.
func lyingProxy(t *testing.T, target string, modify func(*http.Request, *http.Response) error) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error { return modify(resp.Request, resp) }
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL
}

func isObjectGET(r *http.Request, key string) bool {
	return r.Method == http.MethodGet && r.URL.Path == "/"+bucket+"/"+key
}

// replaceBody swaps a response's body, keeping Content-Length honest.
func replaceBody(resp *http.Response, body []byte) {
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
}

// A server that claims an object of 2^63-1 bytes (in the listing and on
// HEAD) must get a clear error, not a crash: the part count overflowed
// and Download panicked in make.
func TestHugeSizeFromServerIsRejected(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	s.PutObject(t, bucket, "m/w.bin", strings.NewReader("payload"), 7)
	huge := strconv.FormatInt(math.MaxInt64, 10)
	sizeRE := regexp.MustCompile(`<Size>\d+</Size>`)
	endpoint := lyingProxy(t, s.Endpoint, func(r *http.Request, resp *http.Response) error {
		switch {
		case r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "2":
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			replaceBody(resp, sizeRE.ReplaceAll(body, []byte("<Size>"+huge+"</Size>")))
		case r.Method == http.MethodHead && resp.StatusCode == http.StatusOK:
			resp.Header.Set("Content-Length", huge)
			resp.ContentLength = math.MaxInt64
		}
		return nil
	})
	c := newOrigin(t, s, endpoint, Options{})
	_, err := c.List(context.Background(), spec.S3URL{Bucket: bucket, Prefix: "m/"})
	if !errors.Is(err, ErrServer) || !strings.Contains(err.Error(), `"m/w.bin"`) {
		t.Errorf("List = %v, want ErrServer naming the key", err)
	}
	// An Object that did not come from List gets the same answer.
	real := listOne(t, newOrigin(t, s, s.Endpoint, Options{}).Client, "m/w.bin")
	real.Size = math.MaxInt64
	if err := c.Download(context.Background(), real, tempFile(t), Plan{}); err == nil {
		t.Error("Download of a 2^63-1 byte object succeeded")
	}
}

// Bytes changed in flight (same headers, same length) must never pass as
// the object, whichever digest checks it.
func TestDownloadRejectsBytesChangedInFlight(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	data := randomBytes(21, 3<<20+11)
	s.PutObject(t, bucket, "m/w.bin", bytes.NewReader(data), int64(len(data)))
	var flips atomic.Int32
	endpoint := lyingProxy(t, s.Endpoint, func(r *http.Request, resp *http.Response) error {
		if !isObjectGET(r, "m/w.bin") || r.Header.Get("Range") != "bytes=1048576-2097151" {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		body[len(body)/2] ^= 0x10
		flips.Add(1)
		replaceBody(resp, body)
		return nil
	})
	for _, ignoreChecksums := range []bool{false, true} {
		c := newOrigin(t, s, endpoint, Options{Concurrency: 2})
		c.ignoreChecksums = ignoreChecksums
		o := listOne(t, c.Client, "m/w.bin")
		before := flips.Load()
		err := c.Download(context.Background(), o, tempFile(t), Plan{})
		if flips.Load() == before {
			t.Fatal("the proxy changed no byte; the test proves nothing")
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("ignoreChecksums=%v: Download through a bit flip = %v, want ErrCorrupt", ignoreChecksums, err)
		}
	}
}

// A body that ends cleanly before its Content-Length (no reset) is resumed
// at the byte where it stopped, and the copy is whole.
func TestDownloadResumesShortBodies(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	data := randomBytes(22, 2<<20+5)
	s.PutObject(t, bucket, "m/w.bin", bytes.NewReader(data), int64(len(data)))
	var short atomic.Int32
	endpoint := lyingProxy(t, s.Endpoint, func(r *http.Request, resp *http.Response) error {
		if !isObjectGET(r, "m/w.bin") || short.Add(1) > 3 {
			return nil
		}
		// Content-Length stays as the server sent it; the body stops early.
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, 1000), resp.Body}
		return nil
	})
	c := newOrigin(t, s, endpoint, Options{Concurrency: 1})
	o := listOne(t, c.Client, "m/w.bin")
	f := tempFile(t)
	var v Verification
	if err := c.Download(context.Background(), o, f, Plan{OnVerify: func(got Verification) { v = got }}); err != nil {
		t.Fatal(err)
	}
	assertContent(t, f, data)
	if !v.Verified {
		t.Errorf("verification %+v", v)
	}
	if gets, want := short.Load(), int32(Parts(o.Size, MinPartSize)+3); gets != want {
		t.Errorf("%d GETs, want %d (one per part and one per short body)", gets, want)
	}
	if got := c.bytes.Load(); got != int64(len(data)) {
		t.Errorf("read %d body bytes for a %d-byte object: short bodies were refetched, not resumed", got, len(data))
	}
}

// putParts uploads data as a multipart object with the given part sizes.
func putParts(t *testing.T, s *testenv.S3, key string, data []byte, sizes []int64) {
	t.Helper()
	ctx := context.Background()
	c := s.Client(t)
	up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	var parts []types.CompletedPart
	off := int64(0)
	for i, n := range sizes {
		out, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String(key), UploadId: up.UploadId,
			PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(data[off : off+n]), ContentLength: aws.Int64(n)})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))})
		off += n
	}
	if off != int64(len(data)) {
		t.Fatalf("parts cover %d of %d bytes", off, len(data))
	}
	if _, err := c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key),
		UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		t.Fatal(err)
	}
}

// S3 allows parts of different sizes (all but the last at least 5 MiB). A
// layout that the first part's size does not describe, but that has the
// same part count, must not make a good copy look corrupt: the daemon would
// then throw it away and fetch it again forever.
func TestMultipartETagWithUnequalParts(t *testing.T) {
	const mib = 1 << 20
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	tests := []struct {
		name  string
		sizes []int64
	}{
		{"middle part larger", []int64{5 * mib, 6 * mib, mib}},
		{"middle part smaller", []int64{6 * mib, 5 * mib, 2 * mib}},
		{"equal parts", []int64{5 * mib, 5 * mib, 3}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var total int64
			for _, n := range tt.sizes {
				total += n
			}
			data := randomBytes(byte(30+i), int(total))
			key := fmt.Sprintf("m/unequal%d.bin", i)
			putParts(t, s, key, data, tt.sizes)
			c := newOrigin(t, s, s.Endpoint, Options{})
			c.ignoreChecksums = true
			o := listOne(t, c.Client, key)
			if !strings.HasSuffix(o.ETag, fmt.Sprintf("-%d", len(tt.sizes))) {
				t.Fatalf("ETag %q is not a %d-part multipart ETag", o.ETag, len(tt.sizes))
			}
			f := tempFile(t)
			if _, err := f.WriteAt(data, 0); err != nil {
				t.Fatal(err)
			}
			v, err := c.Verify(context.Background(), o, f)
			if err != nil {
				t.Fatalf("Verify of a good copy = %v", err)
			}
			if !v.Verified || v.Method != MethodMD5Multipart {
				t.Errorf("Verify = %+v, want verified by %s", v, MethodMD5Multipart)
			}
			// And the check still catches a bad byte in the part it had to size.
			if _, err := f.WriteAt([]byte{data[total-2] ^ 1}, total-2); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Verify(context.Background(), o, f); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Verify of a corrupt copy = %v, want ErrCorrupt", err)
			}
		})
	}
}

// A listing page that says "truncated" must lead to the rest of the listing
// or to an error: ending there would cache part of a model as all of it,
// and a server that hands back the same continuation token would keep List
// looping forever.
func TestListDetectsBrokenPagination(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	for _, k := range []string{"m/a", "m/b"} {
		s.PutObject(t, bucket, k, strings.NewReader(k), int64(len(k)))
	}
	// A healthy listing of more than one page is read whole: the proxy cuts
	// the first page after one key and hands out the gateway's own kind of
	// token (the last key), which the gateway then continues from.
	contentsRE := regexp.MustCompile(`(?s)<Contents>.*?</Contents>`)
	keyRE := regexp.MustCompile(`<Key>([^<]*)</Key>`)
	var healthyPages atomic.Int32
	paging := lyingProxy(t, s.Endpoint, func(r *http.Request, resp *http.Response) error {
		if r.URL.Query().Get("list-type") != "2" || resp.StatusCode != http.StatusOK {
			return nil
		}
		healthyPages.Add(1)
		if r.URL.Query().Get("continuation-token") != "" {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		all := contentsRE.FindAll(body, -1)
		first := bytes.Index(body, all[0])
		last := all[len(all)-1]
		end := bytes.Index(body, last) + len(last)
		cut := append(append(append([]byte(nil), body[:first]...), all[0]...), body[end:]...)
		token := keyRE.FindSubmatch(all[0])[1]
		cut = bytes.Replace(cut, []byte("<IsTruncated>false</IsTruncated>"),
			[]byte("<IsTruncated>true</IsTruncated><NextContinuationToken>"+string(token)+"</NextContinuationToken>"), 1)
		replaceBody(resp, cut)
		return nil
	})
	c := newOrigin(t, s, paging, Options{})
	objs, err := c.List(context.Background(), spec.S3URL{Bucket: bucket, Prefix: "m/"})
	if err != nil || len(objs) != 2 || healthyPages.Load() != 2 {
		t.Fatalf("List = %d objects in %d pages, %v; want both, in two pages", len(objs), healthyPages.Load(), err)
	}

	tests := []struct {
		name, truncated string
	}{
		{"truncated without a token", "<IsTruncated>true</IsTruncated>"},
		{"same token again", "<IsTruncated>true</IsTruncated><NextContinuationToken>again</NextContinuationToken>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pages atomic.Int32
			endpoint := lyingProxy(t, s.Endpoint, func(r *http.Request, resp *http.Response) error {
				if r.Method != http.MethodGet || r.URL.Query().Get("list-type") != "2" || resp.StatusCode != http.StatusOK {
					return nil
				}
				pages.Add(1)
				body, err := io.ReadAll(resp.Body)
				if err != nil {
					return err
				}
				body = bytes.Replace(body, []byte("<IsTruncated>false</IsTruncated>"), []byte(tt.truncated), 1)
				replaceBody(resp, body)
				return nil
			})
			c := newOrigin(t, s, endpoint, Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			objs, err := c.List(ctx, spec.S3URL{Bucket: bucket, Prefix: "m/"})
			if !errors.Is(err, ErrServer) {
				t.Errorf("List = %d objects, %v after %d pages; want ErrServer", len(objs), err, pages.Load())
			}
		})
	}
}

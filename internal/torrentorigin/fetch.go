package torrentorigin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/anacrolix/torrent/metainfo"

	"github.com/warmfleet/warmfleet/origin"
)

// readTorrentFile reads and checks the .torrent at loc: an http(s) URL,
// s3://bucket/key (through Options.S3) or an absolute path.
func (o *Origin) readTorrentFile(ctx context.Context, loc string) (*metainfo.MetaInfo, error) {
	var r io.ReadCloser
	switch {
	case strings.HasPrefix(loc, "http://") || strings.HasPrefix(loc, "https://"):
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, loc, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("User-Agent", "warmfleet-torrentorigin")
		resp, err := o.opts.HTTP.Do(req)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", origin.ErrUnreachable, err)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			kind := origin.ErrServer
			switch resp.StatusCode {
			case http.StatusNotFound, http.StatusGone:
				kind = origin.ErrNotFound
			case http.StatusUnauthorized, http.StatusForbidden:
				kind = origin.ErrAccessDenied
			}
			return nil, fmt.Errorf("GET %s: %w: %s", loc, kind, resp.Status)
		}
		r = resp.Body
	case strings.HasPrefix(loc, "s3://"):
		var err error
		if r, err = o.openS3(ctx, loc); err != nil {
			return nil, err
		}
	default:
		f, err := os.Open(loc)
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %v", origin.ErrNotFound, err)
		}
		if err != nil {
			return nil, err
		}
		r = f
	}
	defer r.Close()
	mi, err := ParseMetainfo(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", loc, err)
	}
	return mi, nil
}

// openS3 reads one S3 object through the S3 origin, which lists folders:
// the listing of the key's folder, then the object that has the key.
func (o *Origin) openS3(ctx context.Context, loc string) (io.ReadCloser, error) {
	if o.opts.S3 == nil {
		return nil, fmt.Errorf("%s: %w \"s3\" to read the .torrent from", loc, origin.ErrNoOrigin)
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(loc, "s3://"), "/")
	folder := key[:strings.LastIndex(key, "/")+1]
	objs, err := o.opts.S3.List(ctx, "s3://"+bucket+"/"+folder)
	if err != nil && !errors.Is(err, origin.ErrEmpty) {
		return nil, err
	}
	for _, obj := range objs {
		if obj.Key == key {
			if obj.Size > MaxMetainfo {
				return nil, fmt.Errorf("%s: %w: %d bytes, a .torrent holds at most %d", loc, origin.ErrServer, obj.Size, MaxMetainfo)
			}
			var buf bytes.Buffer
			rc, err := o.opts.S3.OpenRange(ctx, obj, 0, obj.Size)
			if err != nil {
				return nil, err
			}
			defer rc.Close()
			if _, err := io.Copy(&buf, io.LimitReader(rc, MaxMetainfo+1)); err != nil {
				return nil, err
			}
			return io.NopCloser(&buf), nil
		}
	}
	return nil, fmt.Errorf("%s: %w", loc, origin.ErrNotFound)
}

package spec

import (
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"path"
	"strconv"
	"strings"
)

// TorrentSource is a parsed BitTorrent source: a magnet link, or a
// .torrent file named by where to read it.
//
//	magnet:?xt=urn:btih:<40 hex or 32 base32>[&dn=...][&tr=...][&x.pe=host:port]
//	torrent+https://host/path/model.torrent   (or torrent+http://)
//	torrent+s3://bucket/key.torrent           (read through the S3 origin)
//	torrent+file:///abs/path/model.torrent    (a file on the node)
//
// The "torrent+" prefix says the URL names a .torrent file to read, not a
// folder of model files (s3://) or a web page.
type TorrentSource struct {
	// Magnet is set for a magnet link: InfoHash is its btih (40 lower-case
	// hex digits), Peers its x.pe addresses (BEP 9), Trackers its tr
	// URLs (used only when the daemon allows trackers).
	Magnet   bool
	InfoHash string
	Peers    []string
	Trackers []string
	// File is the .torrent's location for the other forms: an http(s)
	// URL, s3://bucket/key, or an absolute path (torrent+file://).
	File string
}

// Bounds on a magnet link, so a spec stays small on the wire.
const (
	MaxMagnetBytes = 4096
	MaxMagnetPeers = 32
)

// IsTorrentSource reports whether s is written as a BitTorrent source
// (magnet: or torrent+...://), valid or not.
func IsTorrentSource(s string) bool {
	return strings.HasPrefix(s, "magnet:") || strings.HasPrefix(s, "torrent+")
}

const torrentForms = "magnet:?xt=urn:btih:HASH, torrent+https://HOST/PATH.torrent, torrent+s3://BUCKET/KEY.torrent or torrent+file:///PATH.torrent"

// ParseTorrentSource parses a magnet link or a torrent+...:// source.
func ParseTorrentSource(s string) (TorrentSource, error) {
	if len(s) > MaxMagnetBytes {
		return TorrentSource{}, fmt.Errorf("torrent source: %d bytes, at most %d", len(s), MaxMagnetBytes)
	}
	if strings.ContainsAny(s, "\x00\r\n\t ") {
		return TorrentSource{}, fmt.Errorf("torrent source %q: has a space or control character", s)
	}
	if strings.HasPrefix(s, "magnet:") {
		return parseMagnet(s)
	}
	rest, ok := strings.CutPrefix(s, "torrent+")
	if !ok {
		return TorrentSource{}, fmt.Errorf("source %q: want %s", s, torrentForms)
	}
	u, err := url.Parse(rest)
	if err != nil {
		return TorrentSource{}, fmt.Errorf("source %q: %v", s, err)
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" || u.User != nil || u.Fragment != "" {
			return TorrentSource{}, fmt.Errorf("source %q: want torrent+%s://HOST/PATH (no user info, no fragment)", s, u.Scheme)
		}
	case "s3":
		if _, err := ParseS3URL(rest + "/"); err != nil || strings.HasSuffix(rest, "/") || u.RawQuery != "" || u.Fragment != "" {
			return TorrentSource{}, fmt.Errorf("source %q: want torrent+s3://BUCKET/KEY naming one object", s)
		}
	case "file":
		p := u.Path
		if u.Host != "" || u.RawQuery != "" || u.Fragment != "" || !path.IsAbs(p) || path.Clean(p) != p || strings.HasSuffix(p, "/") {
			return TorrentSource{}, fmt.Errorf("source %q: want torrent+file:///ABSOLUTE/PATH.torrent", s)
		}
		return TorrentSource{File: p}, nil
	default:
		return TorrentSource{}, fmt.Errorf("source %q: want %s", s, torrentForms)
	}
	return TorrentSource{File: rest}, nil
}

func parseMagnet(s string) (TorrentSource, error) {
	bad := func(why string, args ...any) (TorrentSource, error) {
		return TorrentSource{}, fmt.Errorf("magnet %q: %s", s, fmt.Sprintf(why, args...))
	}
	q, ok := strings.CutPrefix(s, "magnet:?")
	if !ok {
		return bad("want magnet:?xt=urn:btih:HASH")
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return bad("%v", err)
	}
	var src TorrentSource
	src.Magnet = true
	for _, xt := range vals["xt"] {
		h, ok := strings.CutPrefix(xt, "urn:btih:")
		if !ok {
			continue // another kind (btmh, a v2 hash) may sit beside the btih
		}
		if src.InfoHash != "" {
			return bad("more than one urn:btih")
		}
		if src.InfoHash, err = parseBTIH(h); err != nil {
			return bad("%v", err)
		}
	}
	if src.InfoHash == "" {
		return bad("no xt=urn:btih:HASH (a v1 info hash is needed)")
	}
	if len(vals["x.pe"]) > MaxMagnetPeers {
		return bad("%d x.pe peers, at most %d", len(vals["x.pe"]), MaxMagnetPeers)
	}
	for _, pe := range vals["x.pe"] {
		host, port, err := net.SplitHostPort(pe)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			return bad("x.pe %q: want host:port", pe)
		}
		src.Peers = append(src.Peers, pe)
	}
	for _, tr := range vals["tr"] {
		u, err := url.Parse(tr)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "udp" && u.Scheme != "ws" && u.Scheme != "wss") {
			return bad("tracker %q: want http(s)://, udp:// or ws(s)://", tr)
		}
		src.Trackers = append(src.Trackers, tr)
	}
	return src, nil
}

// parseBTIH reads a v1 info hash: 40 hex digits or 32 base32 characters.
func parseBTIH(h string) (string, error) {
	switch len(h) {
	case 40:
		b, err := hex.DecodeString(h)
		if err != nil {
			return "", fmt.Errorf("info hash %q: not hex", h)
		}
		return hex.EncodeToString(b), nil
	case 32:
		b, err := base32.StdEncoding.DecodeString(strings.ToUpper(h))
		if err != nil {
			return "", fmt.Errorf("info hash %q: not base32", h)
		}
		return hex.EncodeToString(b), nil
	}
	return "", fmt.Errorf("info hash %q: want 40 hex digits or 32 base32 characters", h)
}

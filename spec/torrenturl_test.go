package spec

import (
	"strings"
	"testing"
)

func TestParseTorrentSource(t *testing.T) {
	hex := strings.Repeat("ab", 20)
	good := map[string]TorrentSource{
		"magnet:?xt=urn:btih:" + strings.ToUpper(hex) + "&dn=m&x.pe=127.0.0.1:6881&tr=udp://t.example:80": {
			Magnet: true, InfoHash: hex, Peers: []string{"127.0.0.1:6881"}, Trackers: []string{"udp://t.example:80"}},
		"magnet:?xt=urn:btih:VOVKXK5LVOVKXK5LVOVKXK5LVOVKXK5L": {Magnet: true, InfoHash: mustHex("VOVKXK5LVOVKXK5LVOVKXK5LVOVKXK5L")},
		"torrent+https://h.example/m.torrent":                  {File: "https://h.example/m.torrent"},
		"torrent+s3://models/llama/m.torrent":                  {File: "s3://models/llama/m.torrent"},
		"torrent+file:///var/lib/m.torrent":                    {File: "/var/lib/m.torrent"},
	}
	for s, want := range good {
		got, err := ParseTorrentSource(s)
		if err != nil || got.Magnet != want.Magnet || got.InfoHash != want.InfoHash || got.File != want.File ||
			strings.Join(got.Peers, ",") != strings.Join(want.Peers, ",") || strings.Join(got.Trackers, ",") != strings.Join(want.Trackers, ",") {
			t.Errorf("ParseTorrentSource(%q) = %+v, %v; want %+v", s, got, err, want)
		}
		if err := ValidateSource(s); err != nil {
			t.Errorf("ValidateSource(%q) = %v", s, err)
		}
	}
	for s, why := range map[string]string{
		"magnet:?dn=x":            "no xt=urn:btih",
		"magnet:?xt=urn:btih:123": "40 hex digits",
		"magnet:?xt=urn:btih:" + strings.Repeat("zz", 20):              "not hex",
		"magnet:?xt=urn:btih:" + hex + "&xt=urn:btih:" + hex:           "more than one",
		"magnet:?xt=urn:btih:" + hex + "&x.pe=nohost":                  "x.pe",
		"magnet:?xt=urn:btih:" + hex + "&x.pe=h:99999":                 "x.pe",
		"magnet:?xt=urn:btih:" + hex + "&tr=file:///etc/pass":          "tracker",
		"magnet:xt=urn:btih:" + hex:                                    "want magnet:?",
		"magnet:?xt=urn:btih:" + hex + "&dn=a b":                       "space",
		"torrent+ftp://h/m.torrent":                                    "want magnet",
		"torrent+https:///m.torrent":                                   "HOST",
		"torrent+https://u:p@h/m.torrent":                              "no user info",
		"torrent+s3://Bad_Bucket/m.torrent":                            "one object",
		"torrent+s3://models/dir/":                                     "one object",
		"torrent+file://relative/m.torrent":                            "ABSOLUTE",
		"torrent+file:///a/../m.torrent":                               "ABSOLUTE",
		"magnet:?xt=urn:btih:" + hex + strings.Repeat("&x.pe=h:1", 40): "x.pe peers",
	} {
		_, err := ParseTorrentSource(s)
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseTorrentSource(%q) = %v, want an error saying %q", s, err, why)
		}
		if ValidateSource(s) == nil {
			t.Errorf("ValidateSource(%q) accepted it", s)
		}
	}
}

func mustHex(b32 string) string {
	h, err := parseBTIH(b32)
	if err != nil {
		panic(err)
	}
	return h
}

func FuzzParseTorrentSource(f *testing.F) {
	for _, s := range []string{"magnet:?xt=urn:btih:" + strings.Repeat("ab", 20) + "&x.pe=1.2.3.4:5", "torrent+s3://b/k.torrent", "torrent+file:///x", "magnet:?xt=urn:btih:%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		src, err := ParseTorrentSource(s)
		if err != nil {
			return
		}
		if src.Magnet == (src.File != "") || src.Magnet && len(src.InfoHash) != 40 {
			t.Fatalf("ParseTorrentSource(%q) = %+v", s, src)
		}
	})
}

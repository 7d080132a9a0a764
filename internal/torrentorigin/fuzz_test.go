package torrentorigin

import (
	"bytes"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/torrentseed"
)

// FuzzParseMetainfo: any bytes as a .torrent give a checked layout or an
// error, never a panic, and a layout whose pieces cover its files.
func FuzzParseMetainfo(f *testing.F) {
	mi, err := torrentseed.Build("m", []torrentseed.File{{Path: "a", Data: []byte("hello")}, {Path: "b/c", Data: make([]byte, 40000)}}, 16<<10)
	if err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if err := mi.Write(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte("d4:infod6:lengthi1e4:name1:a12:piece lengthi16384e6:pieces20:aaaaaaaaaaaaaaaaaaaaee"))
	f.Fuzz(func(t *testing.T, b []byte) {
		mi, err := ParseMetainfo(bytes.NewReader(b))
		if err != nil {
			return
		}
		l, err := parseInfo(mi.InfoBytes)
		if err != nil {
			t.Fatalf("ParseMetainfo accepted info parseInfo rejects: %v", err)
		}
		if int64(l.pieces())*l.pieceLength < l.total || len(l.objects()) == 0 && len(l.files) == 0 {
			t.Fatalf("layout %+v", l)
		}
	})
}

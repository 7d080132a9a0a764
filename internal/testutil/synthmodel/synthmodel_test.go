package synthmodel

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

func TestFilesLayout(t *testing.T) {
	tests := []struct {
		opts      Options
		shards    int
		wantData  int64
		wantError string
	}{
		{Options{Size: 10<<20 + 6, Shards: 3}, 3, 10<<20 + 6, ""},
		{Options{Size: 9, Shards: 2}, 2, 8, ""}, // odd bytes per shard dropped
		{Options{Size: 1 << 20}, 4, 1 << 20, ""},
		{Options{Size: 1, Shards: 1}, 0, 0, "size 1"},
		{Options{Size: 1 << 20, Shards: -1}, 0, 0, "shards"},
		{Options{Size: MaxSize + 1}, 0, 0, "size"},
	}
	for _, tt := range tests {
		files, err := Files(tt.opts)
		if tt.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantError) {
				t.Errorf("Files(%+v) = %v, want error %q", tt.opts, err, tt.wantError)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var shards int
		var data int64
		names := map[string]bool{}
		for _, f := range files {
			names[f.Name] = true
			if strings.HasSuffix(f.Name, ".safetensors") {
				shards++
				data += f.dataSize
				if f.Size != int64(len(f.header))+f.dataSize || (len(f.header)-8)%8 != 0 {
					t.Errorf("%s: size %d, header %d, data %d", f.Name, f.Size, len(f.header), f.dataSize)
				}
			}
		}
		if shards != tt.shards || data != tt.wantData || !names["config.json"] || !names["model.safetensors.index.json"] {
			t.Errorf("Files(%+v): %d shards, %d data bytes, names %v", tt.opts, shards, data, names)
		}
	}
}

func TestContentIsDeterministicWithRandomAccess(t *testing.T) {
	opts := Options{Seed: 7, Size: 3<<20 + 10, Shards: 2}
	a, _ := Files(opts)
	b, _ := Files(opts)
	other, _ := Files(Options{Seed: 8, Size: opts.Size, Shards: 2})
	for i, f := range a {
		whole, err := io.ReadAll(f.Open())
		if err != nil || int64(len(whole)) != f.Size {
			t.Fatalf("%s: read %d bytes, %v; want %d", f.Name, len(whole), err, f.Size)
		}
		again, _ := io.ReadAll(b[i].Open())
		if !bytes.Equal(whole, again) {
			t.Errorf("%s differs between two models with the same options", f.Name)
		}
		c := f.Open()
		rng := rand.New(rand.NewPCG(1, 2))
		for range 200 {
			off := rng.Int64N(f.Size)
			buf := make([]byte, rng.IntN(100))
			n, err := c.ReadAt(buf, off)
			want := whole[off:min(off+int64(len(buf)), f.Size)]
			if n != len(want) || !bytes.Equal(buf[:n], want) || (n < len(buf) && err != io.EOF) {
				t.Fatalf("%s: ReadAt(%d bytes at %d) = %d, %v", f.Name, len(buf), off, n, err)
			}
		}
		if _, err := c.Seek(f.Size/2, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		tail, _ := io.ReadAll(c)
		if !bytes.Equal(tail, whole[f.Size/2:]) {
			t.Errorf("%s: read after Seek differs", f.Name)
		}
		if strings.HasSuffix(f.Name, ".safetensors") {
			o, _ := io.ReadAll(other[i].Open())
			if bytes.Equal(whole[len(f.header):], o[len(other[i].header):]) {
				t.Errorf("%s: seeds 7 and 8 give the same data", f.Name)
			}
		}
	}
}

func TestWriteToMakesValidCheckpoint(t *testing.T) {
	m, err := New(Options{Seed: 1, Size: 40<<20 + 2, Shards: 3})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := m.WriteTo(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	// Streaming: 40 MiB written with a 1 MiB buffer, not a file in memory.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("WriteTo allocated %d bytes for a 40 MiB model", alloc)
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil || json.Unmarshal(raw, &index) != nil {
		t.Fatalf("index: %v", err)
	}
	tensors := 0
	var data int64
	for _, f := range m.Files() {
		if !strings.HasSuffix(f.Name, ".safetensors") {
			continue
		}
		h, err := CheckFile(filepath.Join(dir, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		data += h.DataSize
		for _, tn := range h.Tensors {
			tensors++
			if index.WeightMap[tn.Name] != f.Name {
				t.Errorf("index puts %s in %q, header in %q", tn.Name, index.WeightMap[tn.Name], f.Name)
			}
		}
		if h.Metadata["format"] != "pt" {
			t.Errorf("%s metadata %v", f.Name, h.Metadata)
		}
	}
	if tensors != len(index.WeightMap) || data != 40<<20+2 {
		t.Errorf("%d tensors (index has %d), %d data bytes", tensors, len(index.WeightMap), data)
	}
	var cfg map[string]any
	if raw, err := os.ReadFile(filepath.Join(dir, "config.json")); err != nil || json.Unmarshal(raw, &cfg) != nil {
		t.Fatalf("config.json: %v", err)
	}

	// A truncated shard is caught.
	shard := filepath.Join(dir, m.Files()[1].Name)
	if err := os.Truncate(shard, m.Files()[1].Size-1); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckFile(shard); err == nil || !strings.Contains(err.Error(), "header says") {
		t.Errorf("CheckFile of a truncated shard = %v", err)
	}
}

func TestUploadToS3(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, "models")
	m, err := New(Options{Seed: 3, Size: 6 << 20, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Upload(context.Background(), func(ctx context.Context, key string, r io.Reader, size int64) error {
		return s.Put(ctx, "models", "synth/"+key, r, size)
	})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Client(t)
	for _, f := range m.Files() {
		out, err := c.GetObject(context.Background(), getInput("models", "synth/"+f.Name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(out.Body)
		_ = out.Body.Close()
		want, _ := io.ReadAll(f.Open())
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s in S3: %d bytes, %v; want the generated %d", f.Name, len(got), err, len(want))
		}
	}
}

func header(js string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(js))), js...)
}

func TestParseSafetensorsHeader(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		wantErr string
		tensors int
		data    int64
	}{
		{"two tensors", header(`{"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}  `), "", 2, 12},
		{"empty", header(`{}`), "", 0, 0},
		{"scalar", header(`{"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}`), "", 1, 8},
		{"zero length prefix", header(``), "header length 0", 0, 0},
		{"huge prefix", binary.LittleEndian.AppendUint64(nil, 1<<40), "header length", 0, 0},
		{"truncated header", header(`{"a":1}`)[:10], "reading 7-byte header", 0, 0},
		{"short prefix", []byte{1, 2}, "header length", 0, 0},
		{"not an object", header(`[1,2]`), "start with '{'", 0, 0},
		{"bad json", header(`{"a":`), "header", 0, 0},
		{"trailing data", header(`{} x`), "after the JSON object", 0, 0},
		{"unknown dtype", header(`{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}`), "unknown dtype", 0, 0},
		{"shape mismatch", header(`{"a":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}}`), "needs 6 bytes", 0, 0},
		{"gap", header(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`), "contiguous", 0, 0},
		{"overlap", header(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`), "contiguous", 0, 0},
		{"reversed offsets", header(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}}`), "not a range", 0, 0},
		{"negative shape", header(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}`), "tensor", 0, 0},
		{"overflowing shape", header(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`), "overflows", 0, 0},
		{"duplicate tensor", header(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`), "duplicate", 0, 0},
		{"missing offsets", header(`{"a":{"dtype":"U8","shape":[1]}}`), "want dtype", 0, 0},
		{"unknown field", header(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}`), "unknown field", 0, 0},
		{"metadata not strings", header(`{"__metadata__":{"a":1}}`), "__metadata__", 0, 0},
		{"three offsets", header(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`), "2", 0, 0},
	}
	for _, tt := range tests {
		h, err := ParseSafetensorsHeader(bytes.NewReader(tt.in))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || len(h.Tensors) != tt.tensors || h.DataSize != tt.data {
			t.Errorf("%s: %+v, %v", tt.name, h, err)
		}
	}
}

func FuzzParseSafetensorsHeader(f *testing.F) {
	f.Add(header(`{"__metadata__":{"format":"pt"},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`))
	f.Add(header(`{}`))
	m, _ := New(Options{Size: 1 << 20, Shards: 1})
	for _, file := range m.Files() {
		if strings.HasSuffix(file.Name, ".safetensors") {
			f.Add(file.header)
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := ParseSafetensorsHeader(bytes.NewReader(in))
		if err != nil {
			return
		}
		var next int64
		for _, tn := range h.Tensors {
			if tn.Begin != next || tn.End < tn.Begin {
				t.Fatalf("accepted non-contiguous tensors %+v", h.Tensors)
			}
			next = tn.End
		}
		if next != h.DataSize || h.HeaderSize <= 0 || h.HeaderSize > int64(len(in))-8 {
			t.Fatalf("accepted inconsistent header %+v for %d input bytes", h, len(in))
		}
	})
}

func getInput(bucket, key string) *s3.GetObjectInput {
	return &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)}
}

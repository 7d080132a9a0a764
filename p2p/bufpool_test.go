package p2p

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBufPoolBoundsAndReuses(t *testing.T) {
	p := newBufPool(2, chunkSize)
	a, err := p.get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.get(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.get(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("third buffer from a pool of two: %v", err)
	}
	p.put(a[:10])
	c, err := p.get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if &c[0] != &a[0] || len(c) != chunkSize {
		t.Fatal("a returned buffer was not reused at full length")
	}
}

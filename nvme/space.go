package nvme

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/warmfleet/warmfleet/internal/bytesize"
)

// Space is a file system's size and free space, in bytes.
type Space struct {
	Total int64 `json:"total_bytes"`
	Free  int64 `json:"free_bytes"`
}

func statFS(path string) (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Space{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	return Space{Total: int64(st.Blocks) * st.Bsize, Free: int64(st.Bavail) * st.Bsize}, nil
}

// Space reports the data directory's file system.
func (s *Store) Space() (Space, error) { return s.statFS(s.dir) }

// The daemon's default reserve: the larger of these is left free.
const (
	DefaultReserveBytes    = 1 << 30
	DefaultReserveFraction = 0.05
)

// Reserve is the number of bytes the store leaves free on a file system.
func (s *Store) Reserve(sp Space) int64 {
	return ReserveOf(sp, s.opts.ReserveBytes, s.opts.ReserveFraction)
}

// ReserveOf is what a store with those reserve options leaves free on sp.
func ReserveOf(sp Space, bytes int64, fraction float64) int64 {
	return max(bytes, int64(float64(sp.Total)*fraction))
}

// Available is what the cache may still use: free space less the reserve.
func (s *Store) Available() (int64, error) {
	sp, err := s.Space()
	if err != nil {
		return 0, err
	}
	return max(0, sp.Free-s.Reserve(sp)), nil
}

// CheckFits fails with ErrNoSpace when need more bytes do not fit.
func (s *Store) CheckFits(need int64) error {
	if need <= 0 {
		return nil
	}
	sp, err := s.Space()
	if err != nil {
		return err
	}
	return Fits(need, sp, s.Reserve(sp))
}

// Fits decides whether need bytes fit in sp while keeping reserve free.
func Fits(need int64, sp Space, reserve int64) error {
	if avail := sp.Free - reserve; need > avail {
		return fmt.Errorf("%w: need %s, %s free with %s kept in reserve", ErrNoSpace,
			bytesize.Format(need), bytesize.Format(sp.Free), bytesize.Format(reserve))
	}
	return nil
}

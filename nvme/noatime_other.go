//go:build !linux

package nvme

const oNoATime = 0

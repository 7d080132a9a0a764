package nvme

import "syscall"

const oNoATime = syscall.O_NOATIME

package fake

import "syscall"

const syscallKill = syscall.SIGKILL

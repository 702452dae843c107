package process

import "syscall"

func closeFD(fd int) { _ = syscall.Close(fd) }

package limits

// addressBits: aarch64 Linux gives a process 48 bits of user virtual address space (a kernel built for
// 52-bit addresses gives more only to a process that maps above 48 bits on purpose).
const addressBits = 48

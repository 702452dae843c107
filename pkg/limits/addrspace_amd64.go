package limits

// addressBits: x86-64 Linux gives a process 47 bits of user virtual address space (four-level paging;
// five-level paging gives more only to a process that maps above it on purpose).
const addressBits = 47

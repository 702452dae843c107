// heap_malloc: proves the device malloc heap limit (issue 5, item 3).
//
// Every thread mallocs nbytes from the device heap and keeps the block (it is never freed, so the heap
// fills up); a thread whose malloc returns NULL adds one to *nulls. docs/contributing/driver-facts.md, 1024 x 256 threads of
// 1 KiB each: 258,366 NULLs under the default 8 MiB heap, 0 after raising the heap to 1 GiB before the first
// launch.
//
// Compiled to heap_malloc.ptx on the GPU machine by scripts/gpu/build_ptx.sh; the PTX is committed.

extern "C" __global__ void heap_malloc(unsigned int *nulls, unsigned long long nbytes)
{
    char *p = (char *)malloc(nbytes);
    if (p == NULL) {
        atomicAdd(nulls, 1u);
    } else {
        // Touch the block so that the allocation cannot be optimized away.
        ((volatile char *)p)[0] = 1;
    }
}

// fill: the launch-test kernel. tests/kernels/fill.ptx is a hand-written equivalent (the development
// machine has no nvcc); scripts/gpu/build_ptx.sh compiles this file to fill_nvcc.ptx on the GPU machine to
// cross-check it.

extern "C" __global__ void fill(unsigned int *p, unsigned int v, unsigned long long n)
{
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        p[i] = v;
    }
}

extern "C" __global__ void __launch_bounds__(256) fill_f32(float *p, float v, unsigned long long n)
{
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        p[i] = v;
    }
}

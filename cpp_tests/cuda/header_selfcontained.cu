// Compiles xlog/shmem_allocator.cuh with nothing included before it, so a
// missing include in the header fails the build here rather than in a user's
// kernel. Running it only proves it linked.
#include <xlog/shmem_allocator.cuh>

__global__ void header_selfcontained_kernel(unsigned* out) {
  xlog::ShmemAllocator shmem;
  float* scratch = shmem.alloc<float>(4);
  if (scratch != nullptr) scratch[0] = 1.0f;
  out[0] = shmem.get_allocated_size_bytes();
}

int main() { return 0; }

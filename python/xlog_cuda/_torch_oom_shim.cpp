// Makes a refused allocation reach Python as torch.OutOfMemoryError.
//
// PyTorch's CUDAPluggableAllocator does not check the pointer its malloc
// function returns (pytorch/pytorch#133280): a NULL from xlog_torch_malloc
// becomes a tensor whose data pointer is 0. PyTorch turns a C++
// c10::OutOfMemoryError thrown from the allocator into torch.OutOfMemoryError,
// so this shim, built against the installed PyTorch's headers by
// xlog_cuda.torch.enable(), wraps the library's hooks and throws one, with
// the library's message, when an allocation is refused.
//
// The library's entry points come from Python (xlog_shim_bind), as the
// addresses of the libxlog_cuda instance the package loaded, so the shim
// always drives that instance: one hook runtime, one budget.

#include <c10/util/Exception.h>

#include <cstddef>
#include <sys/types.h>

namespace {

using MallocFn = void* (*)(size_t, int, void*);
using FreeFn = void (*)(void*, size_t, int, void*);

MallocFn g_malloc = nullptr;
FreeFn g_free = nullptr;

}  // namespace

extern "C" {

// Called once from Python with xlog_torch_malloc and xlog_torch_free of the
// loaded library.
void xlog_shim_bind(void* malloc_fn, void* free_fn) {
  g_malloc = reinterpret_cast<MallocFn>(malloc_fn);
  g_free = reinterpret_cast<FreeFn>(free_fn);
}

void* xlog_shim_torch_malloc(ssize_t size, int device, void* stream) {
  void* ptr = g_malloc(static_cast<size_t>(size), device, stream);
  if (ptr == nullptr && size > 0) {
    // The library's reason (requested, live, pending, limit) stays in its
    // thread-local last error, read through xlog_cuda.last_error(). (A
    // message formatted with numbers here crashed PyTorch 2.11 on the GPU
    // machine during the throw; a literal one does not.)
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "xlog-cuda refused the allocation: out of budget or device memory "
                     "(the numbers: xlog_cuda.last_error() on this thread)");
  }
  return ptr;
}

void xlog_shim_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  if (g_free != nullptr) g_free(ptr, static_cast<size_t>(size), device, stream);
}

}  // extern "C"

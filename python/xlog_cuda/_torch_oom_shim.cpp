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
#include <string>
#include <sys/types.h>

namespace {

using MallocFn = void* (*)(size_t, int, void*);
using FreeFn = void (*)(void*, size_t, int, void*);
using MessageFn = size_t (*)(char*, size_t);

MallocFn g_malloc = nullptr;
FreeFn g_free = nullptr;
MessageFn g_message = nullptr;

std::string last_error() {
  if (g_message == nullptr) return "";
  std::string text(g_message(nullptr, 0) + 1, '\0');
  size_t n = g_message(text.data(), text.size());
  text.resize(n < text.size() ? n : text.size() - 1);
  return text;
}

}  // namespace

extern "C" {

// Called once from Python with xlog_torch_malloc, xlog_torch_free and
// xlog_last_error_message of the loaded library.
void xlog_shim_bind(void* malloc_fn, void* free_fn, void* message_fn) {
  g_malloc = reinterpret_cast<MallocFn>(malloc_fn);
  g_free = reinterpret_cast<FreeFn>(free_fn);
  g_message = reinterpret_cast<MessageFn>(message_fn);
}

void* xlog_shim_torch_malloc(ssize_t size, int device, void* stream) {
  TORCH_CHECK(g_malloc != nullptr, "xlog_cuda: the PyTorch OOM shim was used before xlog_shim_bind");
  TORCH_CHECK(size >= 0, "xlog_cuda: PyTorch asked for a negative size (", size, " bytes)");
  void* ptr = g_malloc(static_cast<size_t>(size), device, stream);
  if (ptr == nullptr && size > 0) {
    // The library's thread-local message stays readable afterwards through
    // xlog_cuda.last_error() on this thread.
    TORCH_CHECK_WITH(OutOfMemoryError, false, "xlog-cuda refused an allocation of ", size,
                     " bytes on device ", device, ": ", last_error());
  }
  return ptr;
}

void xlog_shim_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  if (g_free != nullptr) g_free(ptr, static_cast<size_t>(size), device, stream);
}

}  // extern "C"

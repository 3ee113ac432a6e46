// Aligned byte buffers for the library's large memory: packed weights, parameters'
// values (which loading frees once they are packed) and the arenas' blocks.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#include <sys/mman.h>

namespace ldlm {

/// 64-byte aligned, uninitialised bytes, owned; move-only. From 1 MB up they are pages of
/// their own (mmap), apart from the heap, so that freeing them gives the memory back to
/// the system at once. glibc raises its mmap threshold to the largest block freed (up to
/// 32 MB), after which its heap serves large blocks too, and keeps their freed memory
/// resident while anything lives above it: packed weights in the heap kept the loading's
/// freed float copies resident, 22 MB of `ldlm generate`'s peak at int8 and 73 MB at fp32
/// (bench/results/README.md, "a float checkpoint loaded at int8, and the heap"); those
/// float copies, parameters' values, are AlignedBytes too. Pages never written are not
/// resident, so a large buffer costs only what is written to it.
class AlignedBytes {
 public:
  static constexpr std::size_t kAlign = 64;
  static constexpr std::size_t kOwnPages = std::size_t(1) << 20;

  AlignedBytes() = default;
  explicit AlignedBytes(std::size_t n) : bytes_(allocate(n), Release{n}) {}

  std::byte* data() const { return bytes_.get(); }
  std::size_t size() const { return bytes_ ? bytes_.get_deleter().size : 0; }

 private:
  static std::byte* allocate(std::size_t n) {
    if (n >= kOwnPages) {
      void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      return static_cast<std::byte*>(p);
    }
    return n > 0 ? static_cast<std::byte*>(::operator new[](n, std::align_val_t(kAlign))) : nullptr;
  }

  // The size tells the release which allocation the bytes came from. No default member
  // initializer: a nested class's is not usable before the enclosing class is complete
  // (GCC, CWG 1397), which made AlignedBytes() ill-formed; bytes_ starts empty instead.
  struct Release {
    std::size_t size;
    void operator()(std::byte* p) const {
      if (size >= kOwnPages)
        ::munmap(p, size);
      else
        ::operator delete[](p, std::align_val_t(kAlign));
    }
  };

  std::unique_ptr<std::byte, Release> bytes_{nullptr, Release{0}};
};

}  // namespace ldlm

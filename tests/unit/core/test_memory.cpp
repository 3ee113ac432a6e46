// AlignedBytes (core/memory.hpp): alignment, moves, and large buffers that go back to the
// system when freed, whatever glibc's heap would do with them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "ldlm/core/memory.hpp"
#include "support/memory.hpp"

namespace unit_core_memory {
namespace {

using ldlm::AlignedBytes;
using ldlm::test::page_resident;

TEST(AlignedBytes, SmallAndLargeBuffersAreAlignedAndWritable) {
  for (const std::size_t n : {std::size_t(1), std::size_t(1000), AlignedBytes::kOwnPages - 1, AlignedBytes::kOwnPages,
                              std::size_t(3) << 20}) {
    AlignedBytes b(n);
    ASSERT_NE(b.data(), nullptr) << n << " bytes";
    EXPECT_EQ(b.size(), n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % AlignedBytes::kAlign, 0u) << n << " bytes";
    std::memset(b.data(), 0x5a, n);
    EXPECT_EQ(static_cast<unsigned char>(b.data()[n - 1]), 0x5a);
  }
  EXPECT_EQ(AlignedBytes(0).data(), nullptr);
}

TEST(AlignedBytes, AMoveHandsOverTheBytesOnce) {
  AlignedBytes a(std::size_t(2) << 20), small(100);
  std::byte* const p = a.data();
  AlignedBytes b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  small = std::move(b);  // frees small's own bytes (ASan names a leak or a double free)
  EXPECT_EQ(small.data(), p);
  EXPECT_EQ(small.size(), std::size_t(2) << 20);
}

TEST(AlignedBytes, ALargeBufferGoesBackToTheSystemWhenFreed) {
  // In a program that has freed a large block, malloc serves the next ones from its heap,
  // whose freed memory stays mapped and resident: ldlm's large buffers must not.
  ldlm::test::raise_malloc_mmap_threshold();
  const void* address = nullptr;
  {
    AlignedBytes b(std::size_t(4) << 20);
    std::memset(b.data(), 1, b.size());
    address = b.data() + b.size() / 2;
    ASSERT_TRUE(page_resident(address));
  }
  EXPECT_FALSE(page_resident(address)) << "the freed buffer's pages are still resident";
}

}  // namespace
}  // namespace unit_core_memory

// AlignedBytes (core/memory.hpp): alignment, moves, and large buffers that go back to the
// system when freed, whatever glibc's heap would do with them; a Parameter's values
// (core/parameter.hpp), which loading frees once they are packed, are such buffers.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "ldlm/core/memory.hpp"
#include "ldlm/core/parameter.hpp"
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
  EXPECT_EQ(AlignedBytes().size(), 0u);
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

TEST(Parameter, ReleasedValuesGoBackToTheSystem) {
  // Loading packs each large weight and releases its float values, some 14 MB a block
  // at ldlm-base width: with the heap's threshold raised they would stay resident.
  ldlm::test::raise_malloc_mmap_threshold();
  ldlm::Parameter<float> weight({1024, 1024});
  weight.vector().setConstant(1.0f);
  const void* address = weight.data() + weight.numel() / 2;
  ASSERT_TRUE(page_resident(address));
  weight.release();
  EXPECT_FALSE(page_resident(address)) << "the released values' pages are still resident";
}

TEST(Parameter, ACopyHasItsOwnValues) {
  ldlm::Parameter<float> a({2, 3});
  a.vector().setLinSpaced(6, 0.0f, 5.0f);
  ldlm::Parameter<float> b = a;
  b.vector()[0] = 7.0f;
  EXPECT_EQ(a.data()[0], 0.0f);
  EXPECT_EQ(b.data()[5], 5.0f);
  ldlm::Parameter<float> c({1});
  c = b;
  EXPECT_EQ(c.shape(), (ldlm::Shape{2, 3}));
  EXPECT_EQ(c.data()[0], 7.0f);
}

}  // namespace
}  // namespace unit_core_memory

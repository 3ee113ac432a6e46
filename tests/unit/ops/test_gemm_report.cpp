// What runs (ops/gemm_report.hpp): the CPU and the kernel of every product path, and what
// the CTest runs that force a path expect (tests/CMakeLists.txt).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "ldlm/ldlm.hpp"
#include "support/modules.hpp"
#include "support/reference.hpp"

namespace unit_ops_gemm_report {
namespace {

using namespace ldlm;
using ::testing::HasSubstr;

TEST(GemmReport, ReportsTheCpuAndTheKernelOfEveryPath) {
  const CpuFeatures& cpu = cpu_features();
  const GemmPaths paths = gemm_paths();
  ::testing::Test::RecordProperty("cpu", cpu.brand + " [" + cpu.summary() + "]");
  ::testing::Test::RecordProperty("fp32_linear", paths.fp32_linear);
  ::testing::Test::RecordProperty("bf16_linear", paths.bf16_linear);
  ::testing::Test::RecordProperty("fp32_attention", paths.fp32_attention);
  ::testing::Test::RecordProperty("bf16_attention", paths.bf16_attention);
  EXPECT_EQ(paths.backend, backend_name(gemm_backend()));
  for (const std::string* kernel :
       {&paths.fp32_linear, &paths.bf16_linear, &paths.fp32_attention, &paths.bf16_attention}) {
    EXPECT_FALSE(kernel->empty());
    EXPECT_FALSE(kernel->starts_with("ref")) << *kernel << ": a reference loop, not a kernel";
  }
  // A CPU with AVX-512 or AVX2 never lands on a generic kernel.
  if (gemm_backend() == GemmBackend::onednn && cpu.avx2) {
    EXPECT_THAT(paths.fp32_linear, ::testing::Not(HasSubstr("sse")));
  }
  // The CTest runs that force a path say what they expect (tests/CMakeLists.txt).
  if (const char* expected = std::getenv("LDLM_EXPECT_BACKEND")) {
    EXPECT_EQ(paths.backend, expected);
  }
  if (const char* expected = std::getenv("LDLM_EXPECT_BF16_NATIVE")) {
    EXPECT_EQ(bf16_operands_native(), std::string(expected) == "1") << paths.bf16_linear;
  }
  // Without bf16 kernels, bf16 weights stay in bf16 and are widened for fp32 kernels.
  if (!bf16_operands_native()) {
    EXPECT_THAT(paths.bf16_linear, HasSubstr("widened"));
  }
  // Uncapped, bf16 takes the CPU's best instructions in attention as in the linear
  // maps: oneDNN's runtime-shape GEMM (gemm:jit) has no AMX kernel, and ran attention
  // 10x slower.
  if (gemm_backend() == GemmBackend::onednn && !std::getenv("ONEDNN_MAX_CPU_ISA") && !std::getenv("DNNL_MAX_CPU_ISA")) {
    if (cpu.amx_bf16) {
      EXPECT_THAT(paths.bf16_linear, HasSubstr("amx"));
      EXPECT_THAT(paths.bf16_attention, HasSubstr("amx"));
    } else if (cpu.avx512_bf16) {
      EXPECT_TRUE(bf16_operands_native()) << paths.bf16_linear;
      EXPECT_THAT(paths.bf16_attention, HasSubstr("brg:avx512_core_bf16"));
    }
    // ldlm's CPUID and oneDNN's agree on VNNI, which `ldlm info` and the int8 peak
    // (bench_peak.cpp) read from the former.
    if (!cpu.amx_bf16) {
      EXPECT_EQ(cpu.avx512_vnni, paths.int8_linear.starts_with("brg:avx512_core_vnni"))
          << "int8 kernel " << paths.int8_linear << ", features " << cpu.summary();
    }
  }
}

}  // namespace
}  // namespace unit_ops_gemm_report

// ldlm info: the CPU's features and the kernels chosen for fp32, bf16 and int8.
#pragma once

#include "common.hpp"

namespace ldlm::cli {

const Command kInfo{"info",
                    "CPU features and the kernels chosen for fp32, bf16 and int8",
                    "",
                    "Print the CPU's features and the kernel that runs each kind of product, in fp32,\n"
                    "bf16 and int8. The choice follows CPUID, never the CPU model; LDLM_GEMM_BACKEND=eigen and\n"
                    "oneDNN's ONEDNN_MAX_CPU_ISA force other paths (for tests and diagnosis).",
                    {},
                    ""};

int run_info(const Args& args) {
  args.expect_positionals(0, 0);
  const CpuFeatures& cpu = cpu_features();
  const GemmPaths paths = gemm_paths();
  std::printf("ldlm %s\n", LDLM_VERSION);
  std::printf("cpu:       %s (%s, family %d, model %d), %u hardware threads\n",
              cpu.brand.empty() ? "unknown" : cpu.brand.c_str(), cpu.vendor.c_str(), cpu.family, cpu.model,
              std::max(1u, std::thread::hardware_concurrency()));
  std::printf("features:  %s\n", cpu.summary().c_str());
  std::printf("products:  %s\n", gemm_library().c_str());
  std::printf("fp32:      linear %s, attention %s\n", paths.fp32_linear.c_str(), paths.fp32_attention.c_str());
  std::printf("bf16:      linear %s, attention %s\n", paths.bf16_linear.c_str(), paths.bf16_attention.c_str());
  std::printf("int8:      linear %s\n", paths.int8_linear.c_str());
  if (const auto demo = embedded::find("ldlm-demo.safetensors"))
    std::printf("model:     built-in demo model, %.1f MB (the default of generate and reconstruct)\n",
                static_cast<double>(demo->size()) / 1e6);
  return 0;
}

}  // namespace ldlm::cli

// What the CPU can do, read from CPUID and XGETBV, never from a model-number table:
// a library that guesses by model falls back to generic code on CPUs newer than
// itself (bench/results/README.md has a case).
// A feature counts only when the OS also saves its registers (XCR0), as AVX-512 and
// AMX need.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define LDLM_HAVE_CPUID 1
#endif

namespace ldlm {

struct CpuFeatures {
  std::string vendor;  // CPUID's vendor string (leaf 0)
  std::string brand;   // CPUID's brand string (leaves 0x80000002-4), trimmed
  int family = 0, model = 0;
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false, avx512_vnni = false;
  bool amx_tile = false, amx_bf16 = false;

  /// The features that matter to ldlm's kernels, e.g. "avx2 fma avx512f ... amx_bf16".
  std::string summary() const {
    std::string s;
    // Appended piece by piece: `"" + std::string(name)` made GCC 12 report a false
    // -Wrestrict (its PR 105329) in a build without oneDNN.
    auto add = [&](bool on, const char* name) {
      if (!on) return;
      if (!s.empty()) s += ' ';
      s += name;
    };
    add(avx2, "avx2");
    add(fma, "fma");
    add(avx512f, "avx512f");
    add(avx512bw, "avx512bw");
    add(avx512vl, "avx512vl");
    add(avx512dq, "avx512dq");
    add(avx512_bf16, "avx512_bf16");
    add(avx512_fp16, "avx512_fp16");
    add(avx512_vnni, "avx512_vnni");
    add(amx_tile, "amx_tile");
    add(amx_bf16, "amx_bf16");
    return s.empty() ? "none of avx2/avx512/amx" : s;
  }
};

namespace detail {
inline CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if defined(LDLM_HAVE_CPUID)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;

  __get_cpuid(1, &a, &b, &c, &d);
  const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  f.family = static_cast<int>(base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family);
  f.model =
      static_cast<int>(base_family == 0x6 || base_family == 0xf ? base_model | (((a >> 16) & 0xf) << 4) : base_model);
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  std::uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (std::uint64_t(hi) << 32) | lo;
  }
  const bool ymm_state = (xcr0 & 0x6) == 0x6;                 // SSE + AVX registers
  const bool zmm_state = ymm_state && (xcr0 & 0xe0) == 0xe0;  // opmask + upper zmm
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;        // XTILECFG + XTILEDATA
  f.fma = f.fma && avx && ymm_state;

  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = avx && ymm_state && ((b >> 5) & 1);
    f.avx512f = zmm_state && ((b >> 16) & 1);
    f.avx512dq = f.avx512f && ((b >> 17) & 1);
    f.avx512bw = f.avx512f && ((b >> 30) & 1);
    f.avx512vl = f.avx512f && ((b >> 31) & 1);
    f.avx512_fp16 = f.avx512f && ((d >> 23) & 1);
    f.avx512_vnni = f.avx512f && ((c >> 11) & 1);
    f.amx_bf16 = tile_state && ((d >> 22) & 1);
    f.amx_tile = tile_state && ((d >> 24) & 1);
    const unsigned max_subleaf = a;
    if (max_subleaf >= 1) {
      __get_cpuid_count(7, 1, &a, &b, &c, &d);
      f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
    }
  }

  __get_cpuid(0x80000000, &a, &b, &c, &d);
  if (a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002 + leaf, &a, &b, &c, &d);
      std::memcpy(brand + 16 * leaf, &a, 4);
      std::memcpy(brand + 16 * leaf + 4, &b, 4);
      std::memcpy(brand + 16 * leaf + 8, &c, 4);
      std::memcpy(brand + 16 * leaf + 12, &d, 4);
    }
    f.brand = brand;
    const auto first = f.brand.find_first_not_of(' ');
    f.brand = first == std::string::npos ? std::string() : f.brand.substr(first);
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  }
#endif
  return f;
}
}  // namespace detail

/// The running CPU's features, detected once.
inline const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detail::detect_cpu_features();
  return features;
}

}  // namespace ldlm

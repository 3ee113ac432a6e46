// AMX's tile registers, for ldlm's own AMX kernels (ops/attention_amx.hpp) and the
// benchmarks' AMX peak.
//
// Linux hands a process AMX's 8 KB of tile data only when the process asks for it
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); oneDNN asks too, before
// its own AMX kernels. A tile configuration belongs to a thread, and oneDNN's kernels
// load theirs on the same threads, so every ldlm kernel loads its own when it starts.
//
// GCC 12's tile loads are asm statements that declare no memory reads, and ldtilecfg's
// operand is declared as 8 bytes, not 64 (tile stores do clobber memory).
// amx_memory_barrier() goes before the first tile load or configuration of a kernel,
// so that the ordinary stores they read are not moved after them, and after its last
// tile store.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ldlm/core/cpu.hpp"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define LDLM_HAVE_AMX 1
#endif

namespace ldlm {

/// True when the CPU has AMX-BF16 tiles and the kernel lets this process use them.
inline bool amx_bf16_usable() {
#if defined(LDLM_HAVE_AMX)
  static const bool usable = [] {
    const CpuFeatures& cpu = cpu_features();
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return cpu.amx_tile && cpu.amx_bf16 && syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
#else
  return false;
#endif
}

#if defined(LDLM_HAVE_AMX)
namespace detail {
inline constexpr int kAmxTileRows = 16;   // every ldlm tile: 16 rows ...
inline constexpr int kAmxTileBytes = 64;  // ... of 64 bytes (16 fp32 or 32 bf16)

/// ldtilecfg's 64-byte operand, palette 1, with tiles 0-7 at 16 rows of 64 bytes.
struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};

  AmxTileConfig() {
    for (int t = 0; t < 8; ++t) {
      rows[t] = kAmxTileRows;
      bytes_per_row[t] = kAmxTileBytes;
    }
  }
};
static_assert(sizeof(AmxTileConfig) == 64 && offsetof(AmxTileConfig, bytes_per_row) == 16 &&
                  offsetof(AmxTileConfig, rows) == 48,
              "ldtilecfg's layout");

inline void amx_memory_barrier() { __asm__ volatile("" ::: "memory"); }

/// Loads the configuration of 8 full tiles on the calling thread.
__attribute__((target("amx-tile"))) inline void load_full_tiles() {
  static const AmxTileConfig config;
  amx_memory_barrier();
  _tile_loadconfig(&config);
}
}  // namespace detail
#endif

}  // namespace ldlm

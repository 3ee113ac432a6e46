// Test support: whether memory is resident, for tests of what goes back to the system.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

namespace ldlm::test {

/// Resident bytes of this process's mapping that holds `address` (/proc/self/smaps'
/// Rss), or -1 when no mapping holds it.
inline std::int64_t resident_bytes_of_mapping(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(' ') < line.find(':')) {
      inside = begin <= at && at < end;
    } else if (inside && line.starts_with("Rss:")) {
      return std::stoll(line.substr(4)) * 1024;
    }
  }
  return -1;
}

/// Whether the page that holds `address` is resident (mincore): false for an unmapped
/// page, and for a page mapped afresh and never written.
inline bool page_resident(const void* address) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  void* start = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(address) / page * page);
  unsigned char in_core = 0;
  if (::mincore(start, page, &in_core) != 0) return false;  // ENOMEM: not mapped
  return (in_core & 1) != 0;
}

/// Makes glibc serve the next large blocks from its heap, as it does in a program that
/// has freed a large block: it raises its mmap threshold to the largest mapped block
/// freed, up to 32 MB (here 16 MB). Memory that must go back to the system when freed cannot then come from
/// malloc, and a test that frees such memory can tell.
inline void raise_malloc_mmap_threshold() {
  void* large = std::malloc(std::size_t(16) << 20);
  *static_cast<volatile char*>(large) = 1;
  std::free(large);
}

}  // namespace ldlm::test

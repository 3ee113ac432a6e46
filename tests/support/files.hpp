// Test support: scratch directories and checkpoints edited tensor by tensor (rename,
// reshape, retype, add or drop a tensor, then write the file again).
#pragma once

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ldlm/io/safetensors.hpp"

namespace ldlm::test {

/// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "ldlm_test")
      : path_(std::filesystem::temp_directory_path() /
              (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(n_++))) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& f) const { return (path_ / f).string(); }

 private:
  static inline int n_ = 0;
  std::filesystem::path path_;
};

struct RawTensor {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<std::byte> bytes;
};

inline std::vector<RawTensor> raw_tensors(const SafetensorsFile& file) {
  std::vector<RawTensor> out;
  for (const TensorInfo& t : file.tensors()) {
    const auto b = file.bytes(t.name);
    out.push_back({t.name, t.dtype, t.shape, {b.begin(), b.end()}});
  }
  return out;
}

inline void write_tensors(const std::vector<RawTensor>& tensors, const std::string& path,
                          const std::map<std::string, std::string>& metadata = {}) {
  SafetensorsWriter w;
  for (const auto& [k, v] : metadata) w.set_metadata(k, v);
  for (const auto& t : tensors) w.add(t.name, t.dtype, t.shape, t.bytes);
  w.write(path);
}

inline RawTensor& find_tensor(std::vector<RawTensor>& tensors, const std::string& name) {
  for (auto& t : tensors)
    if (t.name == name) return t;
  throw std::runtime_error("test: no tensor " + name);
}

template <class T>
std::vector<T> values_of(const RawTensor& t) {
  std::vector<T> v(t.bytes.size() / sizeof(T));
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  const auto s = std::as_bytes(std::span<const T>(v));
  return {s.begin(), s.end()};
}

}  // namespace ldlm::test

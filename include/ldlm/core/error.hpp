// Exceptions thrown by ldlm. Every message names the operation or module, the
// tensor, and (for shape problems) the expected and actual shapes.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace ldlm {

/// Root of every exception ldlm throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A tensor's rank or extents do not match what the operation needs.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// An argument outside the domain of the operation (token id, time, T = 0, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A file could not be opened, read or written.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A file (safetensors, tokenizer) is malformed, truncated or hostile.
class FormatError : public IoError {
 public:
  using IoError::IoError;
};

/// A checkpoint does not fit the module: missing, unexpected or mis-shaped tensors.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A configuration key is unknown, of the wrong type, or inconsistent.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A non-finite value was found by the optional activation check.
class NumericError : public Error {
 public:
  using Error::Error;
};

/// Thrown by the sampler when the progress callback returns false.
class SamplingCancelled : public Error {
 public:
  using Error::Error;
};

using Shape = std::vector<std::int64_t>;

/// "[2, 7, 768]"; -1 extents print as "*".
inline std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] < 0 ? std::string("*") : std::to_string(shape[i]);
  }
  return s + "]";
}

/// Throws ShapeError unless `actual` matches `expected` (-1 in `expected` matches anything).
inline void check_shape(std::string_view where, std::string_view tensor, std::span<const std::int64_t> expected,
                        std::span<const std::int64_t> actual) {
  bool ok = expected.size() == actual.size();
  for (std::size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i] < 0 || expected[i] == actual[i];
  if (!ok) {
    throw ShapeError(std::string(where) + ": tensor '" + std::string(tensor) + "' expected shape " +
                     shape_string(expected) + ", got " + shape_string(actual));
  }
}

inline void check_shape(std::string_view where, std::string_view tensor, std::initializer_list<std::int64_t> expected,
                        std::span<const std::int64_t> actual) {
  check_shape(where, tensor, std::span<const std::int64_t>(expected.begin(), expected.size()), actual);
}

}  // namespace ldlm

// Test support: reading the PyTorch reference dumps of tests/data and comparing
// with a stated tolerance |got - ref| <= atol + rtol·|ref| (core/compare.hpp). A
// failure names the worst element (multi-index, values, error) and the maximum
// absolute error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"

namespace ldlm::test {

// Appended in place: GCC 12 warns (-Warray-bounds, falsely) on `std::string(dir) + "/" + relative`.
inline std::string data_path(const std::string& relative) {
  std::string path = LDLM_TEST_DATA_DIR;
  path += '/';
  path += relative;
  return path;
}

inline SafetensorsFile open_reference(const std::string& relative) {
  return SafetensorsFile::open(data_path(relative));
}

/// Bitwise equality (memcmp) of n values; a failure counts the elements that differ
/// and names the first.
template <class S>
::testing::AssertionResult bitwise_equal(const std::string& what, const S* got, const S* want, std::size_t n) {
  if (n == 0 || std::memcmp(got, want, n * sizeof(S)) == 0) return ::testing::AssertionSuccess();
  std::size_t first = 0, differing = 0;
  for (std::size_t i = n; i-- > 0;)
    if (std::memcmp(got + i, want + i, sizeof(S)) != 0) first = i, ++differing;
  std::ostringstream msg;
  msg.precision(std::numeric_limits<S>::max_digits10);
  msg << what << ": " << differing << " of " << n << " elements differ bitwise; first at flat index " << first << ": "
      << got[first] << " vs " << want[first];
  return ::testing::AssertionFailure() << msg.str();
}

/// The same for two tensors, whose shapes must agree.
template <class S, int Rank>
::testing::AssertionResult bitwise_equal(const std::string& what, const Tensor<S, Rank>& got,
                                         const Tensor<S, Rank>& want) {
  if (shape_of(got) != shape_of(want))
    return ::testing::AssertionFailure() << what << ": shape " << shape_string(shape_of(got)) << " vs "
                                         << shape_string(shape_of(want));
  return bitwise_equal(what + " " + shape_string(shape_of(want)), got.data(), want.data(),
                       static_cast<std::size_t>(want.size()));
}

/// Reads a tensor of the dump as S, checking its rank.
template <class S, int Rank>
Tensor<S, Rank> read_tensor(const SafetensorsFile& file, const std::string& name) {
  const TensorInfo& info = file.info(name);
  if (info.shape.size() != Rank)
    throw ShapeError("reference: tensor '" + name + "' has shape " + shape_string(info.shape) + ", expected rank " +
                     std::to_string(Rank));
  std::array<Index, Rank> dims{};
  for (int i = 0; i < Rank; ++i) dims[i] = info.shape[i];
  Tensor<S, Rank> t(dims);
  file.read_into(name, t.data(), t.size());
  return t;
}

using ldlm::Tolerance;

/// float32 against a float32 PyTorch dump, |got - ref| <= 1e-5 + 1e-5·|ref| per element:
/// the one tolerance of every single op or module at float32. Both sides run the same
/// float32 operations on the same float32 inputs and parameters; only the order of
/// summation and the exp/tanh/erf implementations differ, which moves O(1) values by a
/// few float32 ulps (2^-23 = 1.2e-7) per reduction, well inside 1e-5. A double
/// computation from the same inputs meets it too: what remains is the dump's own float32
/// rounding. Larger bounds (chains of modules, the real width, bf16) are declared beside
/// their tests and say what grows the error.
inline constexpr Tolerance kFp32Dump{1e-5, 1e-5};

/// Compares the values of `shape` against the reference (core/compare.hpp) and
/// reports the worst element.
template <class S, class R>
::testing::AssertionResult all_close(const std::string& what, const S* got, const R* ref, const Shape& shape,
                                     Tolerance tol) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  const Comparison c = compare_values(got, ref, n, tol);
  std::ostringstream msg;
  msg << what << " " << shape_string(shape) << ": max |error| " << c.max_error << " (atol " << tol.atol << ", rtol "
      << tol.rtol << ")";
  if (c.ok()) return ::testing::AssertionSuccess() << msg.str();
  msg << "; " << c.failures << " of " << n << " elements out of tolerance, worst at " << index_string(c.worst, shape)
      << ": got " << c.worst_got << ", reference " << c.worst_ref << ", error "
      << element_error(c.worst_got, c.worst_ref) << ", allowed " << tol.allowed(c.worst_ref);
  return ::testing::AssertionFailure() << msg.str();
}

/// A tensor against the named reference tensor of a dump (shapes must agree).
template <class S, int Rank>
::testing::AssertionResult matches_reference(const Tensor<S, Rank>& got, const SafetensorsFile& file,
                                             const std::string& name, Tolerance tol) {
  const auto ref = read_tensor<float, Rank>(file, name);
  if (shape_of(got) != shape_of(ref))
    return ::testing::AssertionFailure() << name << ": shape " << shape_string(shape_of(got)) << ", reference "
                                         << shape_string(shape_of(ref));
  return all_close(name, got.data(), ref.data(), shape_of(ref), tol);
}

/// Asserts parity and records the result (with the maximum error) as a test property,
/// visible in --gtest_output=xml/json, so the observed margins are on file.
template <class S, int Rank>
void expect_matches(const Tensor<S, Rank>& got, const SafetensorsFile& file, const std::string& name, Tolerance tol,
                    const std::string& variant = "") {
  const auto result = matches_reference(got, file, name, tol);
  EXPECT_TRUE(result) << "case " << file.metadata().at("case") << variant;
  if (result) ::testing::Test::RecordProperty(name + variant, result.message());
}

/// Compares with the reference and records the observed error as a test property
/// (visible with --gtest_output=xml), which is how the tolerances of the module parity
/// tests (parity/test_modules.cpp, unit/io/test_state_dict.cpp) were chosen.
template <class S, int Rank>
void expect_matches_logging_scaled_error(const Tensor<S, Rank>& got, const SafetensorsFile& ref,
                                         const std::string& name, Tolerance tol) {
  const auto want = read_tensor<float, Rank>(ref, name);
  double max_abs = 0, max_scaled = 0;
  for (Index i = 0; i < want.size() && i < got.size(); ++i) {
    const double err = std::abs(double(got.data()[i]) - want.data()[i]);
    max_abs = std::max(max_abs, err);
    max_scaled = std::max(max_scaled, err / (1.0 + std::abs(want.data()[i])));
  }
  std::ostringstream observed;
  observed << std::scientific << std::setprecision(2) << "max |error| " << max_abs << ", max |error|/(1+|ref|) "
           << max_scaled;
  ::testing::Test::RecordProperty(name + ".error", observed.str());
  EXPECT_TRUE(matches_reference(got, ref, name, tol));
}

/// The largest |a - b| over two same-shaped tensors (for "this bug must show" checks).
template <class S, int Rank>
double max_abs_diff(const Tensor<S, Rank>& a, const Tensor<float, Rank>& b) {
  double m = 0;
  for (Index i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a.data()[i]) - b.data()[i]));
  return m;
}

/// Fills every parameter of `module` from a primitive dump's `param.<name>` tensors;
/// every param.* tensor must be claimed (strict loading), so a misnamed parameter fails.
template <class M>
void load_case_parameters(M& module, const SafetensorsFile& file, bool reject_unexpected = true) {
  LoadOptions options;
  options.scope = "param.";
  options.reject_unexpected = reject_unexpected;
  load_parameters(module, file, "param.", options);
}

/// A tensor of zeros with the dimensions of `t`.
template <class S, int Rank>
Tensor<S, Rank> zeros_like(const Tensor<S, Rank>& t) {
  Tensor<S, Rank> z(t.dimensions());
  z.setZero();
  return z;
}

}  // namespace ldlm::test

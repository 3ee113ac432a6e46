// Test support: reading the PyTorch reference dumps of tests/data and comparing
// with a stated tolerance |got - ref| <= atol + rtol·|ref|. A failure names the
// worst element (multi-index, values, error) and the maximum absolute error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"

namespace ldlm::test {

inline std::string data_path(const std::string& relative) { return std::string(LDLM_TEST_DATA_DIR) + "/" + relative; }

inline SafetensorsFile open_reference(const std::string& relative) { return SafetensorsFile::open(data_path(relative)); }

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

struct Tolerance {
  double atol = 1e-5;
  double rtol = 1e-5;
};

/// Compares n values against the reference and reports the worst element.
template <class S, class R>
::testing::AssertionResult all_close(const std::string& what, const S* got, const R* ref, const Shape& shape,
                                     Tolerance tol) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  double max_abs = 0, worst_excess = -1;
  std::int64_t worst = -1, failures = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    const double err = std::abs(g - r);
    const double excess = std::isnan(g) != std::isnan(r) ? INFINITY : err - (tol.atol + tol.rtol * std::abs(r));
    max_abs = std::isnan(err) ? INFINITY : std::max(max_abs, err);
    if (excess > 0) ++failures;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  std::ostringstream msg;
  msg << what << " " << shape_string(shape) << ": max |error| " << max_abs << " (atol " << tol.atol << ", rtol "
      << tol.rtol << ")";
  if (failures == 0) return ::testing::AssertionSuccess() << msg.str();
  Shape index(shape.size());
  for (std::int64_t rest = worst, k = static_cast<std::int64_t>(shape.size()) - 1; k >= 0; --k) {
    index[k] = rest % shape[k];
    rest /= shape[k];
  }
  msg << "; " << failures << " of " << n << " elements out of tolerance, worst at " << shape_string(index)
      << ": got " << static_cast<double>(got[worst]) << ", reference " << static_cast<double>(ref[worst])
      << ", error " << std::abs(static_cast<double>(got[worst]) - static_cast<double>(ref[worst]));
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

/// The largest |a - b| over two same-shaped tensors (for "this bug must show" checks).
template <class S, int Rank>
double max_abs_diff(const Tensor<S, Rank>& a, const Tensor<float, Rank>& b) {
  double m = 0;
  for (Index i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a.data()[i]) - b.data()[i]));
  return m;
}

}  // namespace ldlm::test

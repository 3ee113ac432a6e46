// ldlm compare: two safetensors files, tensor by tensor, within atol + rtol·|ref|.
#pragma once

#include "common.hpp"

namespace ldlm::cli {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

const Command kCompare{"compare",
                       "compare two safetensors files tensor by tensor",
                       "OUT.safetensors REF.safetensors",
                       "Check every tensor of REF against OUT: same shape and |out - ref| <= atol + rtol*|ref|\n"
                       "elementwise. Prints one line per tensor; exits 1 on any mismatch.",
                       {value_option("atol", "A", &Tolerance::atol, {0.0}, "absolute tolerance"),
                        value_option("rtol", "R", &Tolerance::rtol, {0.0}, "relative tolerance")},
                       ""};

/// The line of a tensor that both files hold with the same shape.
std::string comparison_line(const std::string& label, const Shape& shape, const Comparison& c, Tolerance tol) {
  std::string line =
      std::string(c.ok() ? "ok       " : "MISMATCH ") + " " + label + ": max |error| " + number(c.max_error);
  if (c.worst >= 0)
    line += ", worst at " + index_string(c.worst, shape) + " (out " + number(c.worst_got) + ", ref " +
            number(c.worst_ref) + ", allowed " + number(tol.allowed(c.worst_ref)) + ")";
  if (!c.ok())
    line += "; " + std::to_string(c.failures) + " of " + std::to_string(c.count) + " elements outside tolerance";
  return line;
}

/// Checks REF's tensor `r` against OUT's and prints its line; false when they differ.
bool compare_tensor(const SafetensorsFile& out, const SafetensorsFile& ref, const TensorInfo& r, Tolerance tol) {
  const std::string label = r.name + " " + shape_string(r.shape);
  if (!out.contains(r.name)) {
    std::printf("MISSING   %s: not in %s\n", label.c_str(), out.path().c_str());
    return false;
  }
  const TensorInfo& o = out.info(r.name);
  if (o.shape != r.shape) {
    std::printf("SHAPE     %s: output has shape %s\n", label.c_str(), shape_string(o.shape).c_str());
    return false;
  }
  const auto got = out.read<double>(r.name);
  const auto want = ref.read<double>(r.name);
  const Comparison c = compare_values(got.data(), want.data(), static_cast<std::int64_t>(want.size()), tol);
  std::printf("%s\n", comparison_line(label, r.shape, c, tol).c_str());
  return c.ok();
}

int run_compare(const Args& args) {
  args.expect_positionals(2, 2);
  const Tolerance tol = args.read<Tolerance>();
  const auto out = SafetensorsFile::open(args.positionals()[0]);
  const auto ref = SafetensorsFile::open(args.positionals()[1]);
  int bad = 0, count = 0;
  for (const TensorInfo& r : ref.tensors()) {
    ++count;
    if (!compare_tensor(out, ref, r, tol)) ++bad;
  }
  const std::string tolerance = "atol " + number(tol.atol) + ", rtol " + number(tol.rtol);
  if (bad) {
    std::printf("compare: %d of %d tensor(s) differ (%s)\n", bad, count, tolerance.c_str());
    return 1;
  }
  std::printf("compare: all %d tensor(s) within %s\n", count, tolerance.c_str());
  return 0;
}

}  // namespace ldlm::cli

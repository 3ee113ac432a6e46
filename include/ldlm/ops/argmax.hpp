// Row-wise argmax, the last step from logits to token ids.
#pragma once

#include <cmath>
#include <cstdint>

#include "ldlm/core/tensor.hpp"

namespace ldlm {

/// Row-wise argmax of logits [rows, V] into ids, as torch.argmax: ties go to the
/// lowest id, and NaN counts as the maximum (the first NaN of a row wins).
template <class S>
void argmax_rows(ConstMatRef<S> logits, std::int64_t* ids) {
  for (Index r = 0; r < logits.rows(); ++r) {
    Index best = 0;
    for (Index v = 1; v < logits.cols() && !std::isnan(logits(r, best)); ++v)
      if (std::isnan(logits(r, v)) || logits(r, v) > logits(r, best)) best = v;
    ids[r] = static_cast<std::int64_t>(best);
  }
}

}  // namespace ldlm

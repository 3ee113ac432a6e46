// libFuzzer target for ldlm serve's request parser (tools/ldlm/server/request.hpp): the
// body of every JSON endpoint, from arbitrary bytes. The first byte picks the endpoint
// (modulo 5; the corpus uses the digits: "2" infill, "3" generate, "4" completions,
// "0" tokenize, "1" detokenize).
// Only ApiError may escape, with status 400 and a message that names the endpoint;
// anything else (a crash, a sanitizer report, deep nesting exhausting the stack, a
// nlohmann exception leaking through) is a bug. What is accepted must be within limits.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/request.hpp"

namespace {

using namespace ldlm::server;

RequestLimits limits() {
  RequestLimits l;
  l.max_batch = 8;
  l.max_length = 64;
  l.samplers = {"dpmpp-3m", "heun", "sde"};
  l.schedules = {"karras", "uniform"};
  l.methods = {"x0", "x"};
  l.precisions = {"fp32", "bf16"};
  return l;
}

void check_sampling(const SamplingFields& s, const RequestLimits& l) {
  if (s.n < 1 || s.n > l.max_batch || s.steps < 0 || s.steps > l.max_steps || s.resample < 0 ||
      s.resample > l.max_resample)
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const RequestLimits l = limits();
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 5) {
      case 0: {
        const InfillRequest r = parse_infill(body, l);
        if (r.text.has_value() == r.ids.has_value()) __builtin_trap();
        if (r.ids && static_cast<int>(r.ids->size()) > l.max_length) __builtin_trap();
        check_sampling(r.sampling, l);
        break;
      }
      case 1:
      case 2: {
        const GenerateRequest r =
            parse_generate(data[0] % 5 == 1 ? "/generate" : "/v1/completions", body, l, data[0] % 5 == 2);
        if (r.length < 1 || r.length > l.max_length) __builtin_trap();
        check_sampling(r.sampling, l);
        break;
      }
      case 3:
        parse_tokenize(body);
        break;
      default:
        for (const std::int64_t id : parse_detokenize(body, l).ids)
          if (id < 0) __builtin_trap();
        break;
    }
  } catch (const ApiError& e) {
    if (e.status() != 400 || std::string_view(e.what()).substr(0, 1) != "/") __builtin_trap();
    e.body();  // the error's JSON is always writable
  }
  return 0;
}

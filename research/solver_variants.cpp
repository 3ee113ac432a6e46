// Variants of the default solver at few calls, against the converged reference of
// research/calls.py (issue 38 part 5; research/results/solver-variants-demo-v2-amd-epyc-zen5.md):
//
//   ldlm_solver_variants --weights W.safetensors --seeds 100-163 --calls 6,8,10
//       --rows default,bh1,corrected,oracle2 [--reference-cache R.json] [--length T]
//       [--reference-steps N] [--threads N] --output R.json
//
// Every row is the default solver (unipc-3m, λ grid, extrapolated self-condition) with
// changes joined by '+': bh1 (SolverSettings::unipc_variant); previous (the self-condition
// of the last step); oracleK, a diagnostic, not a sampler: every call's self-conditioning
// input iterated K more times towards its fixed point s = x̂0(x, t, s), the extra calls not
// counted (@A-B: at call indices A … B only; +counted: counted, with fewer steps); aitkenG:
// x̂0 moved to the fixed point of a fixed contraction G, at no call; corrected and
// corrected-free: UniC after the last step too (Row::FinalCall). A cell is the share of decoded ids equal
// to those of the reference, Euler on the probability-flow ODE with 2000 steps on Karras'
// grid, self-condition previous, from the same seed's noise: the ids `ldlm generate` gives
// for each (calls.py's), read from and added to --reference-cache, a calls.py cache. The
// first row is the baseline, and every other row's gain over it is paired by seed.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ldlm/io/state_dict.hpp"
#include "ldlm/ldlm.hpp"

#include "eval_args.hpp"

namespace {

using namespace ldlm;
using bench::arg;
using bench::seed_list;
using bench::split;

struct Row {
  std::string name;
  SolverSettings settings;
  int oracle_iterations = 0;
  double aitken = 0;  // g of aitkenG, 0: off
  // oracleK@A-B: the oracle at call indices A … B only (B omitted: to the last).
  int oracle_first = 0, oracle_last = 1 << 30;
  // counted: the oracle's extra calls count, and the row takes fewer steps to stay within
  // the column's calls.
  bool counted = false;
  // corrected: a call at t_min corrects the last step (UniC), in place of the last step;
  // corrected-free: the same after all the column's steps, the call not counted. Emulated by a
  // step from t_min to t_min (1 − 1e-9), whose own move is of order 1e-9.
  enum class FinalCall { none, counted, extra } final_call = FinalCall::none;

  int steps_for(int calls) const {
    for (int steps = calls; steps >= 1; --steps) {
      const int iterated = std::max(0, std::min(steps - 1, oracle_last) - oracle_first + 1);
      const int final = final_call == FinalCall::counted ? 1 : 0;
      if ((!counted || steps + oracle_iterations * iterated <= calls) && steps + final <= calls) return steps;
    }
    throw InvalidArgument("ldlm_solver_variants: row '" + name + "' has no step count within " +
                          std::to_string(calls) + " calls");
  }
};

Row parse_row(const std::string& name) {
  Row row{name, {}, 0};
  row.settings.kind = SamplerKind::unipc_3m;
  row.settings.self_condition = SelfCondition::extrapolated;
  for (const std::string& change : split(name, '+')) {
    if (change == "default") continue;
    if (change == "bh1")
      row.settings.unipc_variant = UniPCVariant::bh1;
    else if (change == "previous")
      row.settings.self_condition = SelfCondition::previous;
    else if (change == "corrected")
      row.final_call = Row::FinalCall::counted;
    else if (change == "corrected-free")
      row.final_call = Row::FinalCall::extra;
    else if (change.rfind("aitken", 0) == 0)
      row.aitken = std::stod(change.substr(6));
    else if (change == "counted")
      row.counted = true;
    else if (change.rfind("oracle", 0) == 0) {
      const std::string spec = change.substr(6);
      const auto at = spec.find('@');
      row.oracle_iterations = std::stoi(spec.substr(0, at));
      if (at != std::string::npos) {
        const std::string range = spec.substr(at + 1);
        const auto dash = range.find('-');
        row.oracle_first = std::stoi(range.substr(0, dash));
        row.oracle_last = dash == std::string::npos         ? row.oracle_first
                          : dash + 1 == range.size() ? 1 << 30
                                                     : std::stoi(range.substr(dash + 1));
      }
    }
    else
      throw InvalidArgument("ldlm_solver_variants: --rows: unknown change '" + change +
                            "' (default, bh1, previous, corrected, corrected-free, oracleK[@A[-[B]]], counted, aitkenG)");
  }
  return row;
}

struct Runner {
  const LDLM<float>& model;
  Context& ctx;
  Index T;

  /// Per call index: the sum over runs of ‖f³(s) − f²(s)‖ / ‖f²(s) − f(s)‖, f = x̂0(x, t, ·),
  /// when the oracle iterates at least twice: how fast the self-condition converges.
  mutable std::vector<double> contraction;
  mutable int contraction_runs = 0;

  std::vector<std::int64_t> ids(std::uint64_t seed, const SolverSettings& settings, const std::vector<double>& times,
                                int oracle_iterations, double aitken = 0, int oracle_first = 0,
                                int oracle_last = 1 << 30) const {
    const TangentSchedule schedule = TangentSchedule::from_config(model.config);
    const Index n = T * model.config.d_model;
    std::vector<float> x(n), condition(n);
    NormalGenerator rng(seed);
    rng.fill(x.data(), n);
    Arena::Scope scope(ctx.arena());
    const DenoiserCall<float> call(ctx, model.denoiser, 1, T);
    std::vector<float> first(n);
    std::size_t index = 0;
    if (oracle_iterations >= 2 && oracle_first == 0 && oracle_last == 1 << 30) {
      contraction.resize(std::max(contraction.size(), times.size() - 1), 0.0);
      ++contraction_runs;
    }
    const auto distance = [n](const float* a, const float* b) {
      double sum = 0;
      for (Index k = 0; k < n; ++k) sum += (double(a[k]) - double(b[k])) * (double(a[k]) - double(b[k]));
      return std::sqrt(sum);
    };
    const auto denoise = [&](const float* at, double t, const float* self_cond, float* x0) {
      call(at, t, self_cond, x0);
      // One Aitken step with a fixed contraction g: with f(s) − s* ≈ g (s − s*), the fixed point
      // is s* ≈ f(s) + g/(1 − g) (f(s) − s), from the one call made.
      if (aitken != 0)
        for (Index k = 0; k < n; ++k)
          x0[k] = static_cast<float>(double(x0[k]) + aitken / (1 - aitken) * (double(x0[k]) - double(self_cond[k])));
      std::copy(x0, x0 + n, first.begin());
      const int iterations = int(index) >= oracle_first && int(index) <= oracle_last ? oracle_iterations : 0;
      for (int k = 0; k < iterations; ++k) {
        std::copy(x0, x0 + n, condition.begin());
        call(at, t, condition.data(), x0);
        if (k == 1 && index < contraction.size()) contraction[index] += distance(x0, condition.data()) / distance(condition.data(), first.data());
      }
      ++index;
    };
    integrate<float>(denoise, settings, schedule, times, n, x.data(), rng, ctx.arena());
    Tensor3<float> z(1, T, model.config.d_model);
    std::copy(x.begin(), x.end(), z.data());
    const TokenTensor tokens = Pipeline<float>(model).decode_tokens(ctx, z);
    return {tokens.data(), tokens.data() + tokens.size()};
  }
};

std::pair<double, double> mean_and_error(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m += x;
  m /= double(v.size());
  double var = 0;
  for (double x : v) var += (x - m) * (x - m);
  return {m, v.size() > 1 ? std::sqrt(var / double(v.size() - 1) / double(v.size())) : NAN};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    const std::string weights_path = arg(args, "weights", ""), output = arg(args, "output", "");
    if (weights_path.empty() || output.empty()) {
      std::fprintf(stderr,
                   "usage: ldlm_solver_variants --weights W.safetensors --seeds 100-163 --calls 6,8,10\n"
                   "       --rows default,bh1,corrected,oracle2 [--reference-cache R.json] [--length T]\n"
                   "       [--reference-steps N] [--threads N] --output R.json\n");
      return 2;
    }
    const SafetensorsFile file = SafetensorsFile::open(weights_path);
    const Config config = resolve_config(file, std::nullopt);
    LDLM<float> model(config);
    for (const auto name : {Denoiser<>::kName, LatentDecoder<>::kName, TokenDecoder<>::kName})
      load_module(model, file, name);
    Context ctx(std::stoi(arg(args, "threads", "1")));
    const TangentSchedule schedule = TangentSchedule::from_config(config);
    const Index T = std::stoll(arg(args, "length", "64"));
    const Runner runner{model, ctx, T, {}, 0};
    const std::vector<std::uint64_t> seeds = seed_list(arg(args, "seeds", "8-31"));
    std::vector<int> calls;
    for (const auto& c : split(arg(args, "calls", "6,8,10"))) calls.push_back(std::stoi(c));
    std::vector<Row> rows;
    for (const auto& r : split(arg(args, "rows", "default"))) rows.push_back(parse_row(r));

    // The reference, keyed as calls.py keys its cache (ids as strings).
    const int reference_steps = std::stoi(arg(args, "reference-steps", "2000"));
    const std::string cache_path = arg(args, "reference-cache", "");
    nlohmann::json cache = nlohmann::json::object();
    if (!cache_path.empty())
      if (std::ifstream in(cache_path); in) in >> cache;
    const auto key = [&](std::uint64_t s) {
      return weights_path + "|" + std::to_string(T) + "|" + std::to_string(reference_steps) + "|" + std::to_string(s);
    };
    SolverSettings reference;
    reference.kind = SamplerKind::ode;
    reference.self_condition = SelfCondition::previous;
    const std::vector<double> fine =
        time_grid(reference_steps, config.t_min, schedule, TimeGridOptions{TimeGrid::karras});
    std::map<std::uint64_t, std::vector<std::int64_t>> reference_ids;
    for (const std::uint64_t s : seeds) {
      if (!cache.contains(key(s))) {
        std::vector<std::string> text;
        for (const std::int64_t id : runner.ids(s, reference, fine, 0)) text.push_back(std::to_string(id));
        cache[key(s)] = text;
        if (!cache_path.empty()) std::ofstream(cache_path) << cache;
        std::fprintf(stderr, "reference, seed %llu\n", static_cast<unsigned long long>(s));
      }
      for (const auto& id : cache.at(key(s))) reference_ids[s].push_back(std::stoll(id.get<std::string>()));
    }

    nlohmann::json per_seed = nlohmann::json::object();
    std::map<std::string, std::vector<double>> scores;
    for (const Row& row : rows)
      for (const int n : calls) {
        std::vector<double> times =
            time_grid(row.steps_for(n), config.t_min, schedule, TimeGridOptions{TimeGrid::lambda});
        if (row.final_call != Row::FinalCall::none) times.push_back(config.t_min * (1 - 1e-9));
        std::vector<double>& cell = scores[row.name + " " + std::to_string(n)];
        for (const std::uint64_t s : seeds) {
          const auto ids = runner.ids(s, row.settings, times, row.oracle_iterations, row.aitken, row.oracle_first,
                                     row.oracle_last);
          const auto& ref = reference_ids.at(s);
          std::size_t same = 0;
          for (std::size_t i = 0; i < ids.size(); ++i) same += ids[i] == ref[i];
          cell.push_back(double(same) / double(ids.size()));
        }
        per_seed[row.name + " " + std::to_string(n)] = cell;
        if (runner.contraction_runs > 0) {
          std::fprintf(stderr, "%s %d calls, contraction per call:", row.name.c_str(), n);
          for (const double c : runner.contraction) std::fprintf(stderr, " %.3f", c / runner.contraction_runs);
          std::fprintf(stderr, "\n");
          runner.contraction.clear();
          runner.contraction_runs = 0;
        }
        const auto [m, e] = mean_and_error(cell);
        std::fprintf(stderr, "%-30s %3d calls: %.3f ± %.3f\n", row.name.c_str(), n, m, e);
      }

    std::string table = "| row |";
    for (const int n : calls) table += " " + std::to_string(n) + " calls |";
    table += "\n|---|";
    for (std::size_t i = 0; i < calls.size(); ++i) table += "---|";
    char buffer[128];
    for (const Row& row : rows) {
      table += "\n| `" + row.name + "` |";
      for (const int n : calls) {
        const auto& cell = scores[row.name + " " + std::to_string(n)];
        const auto [m, e] = mean_and_error(cell);
        std::snprintf(buffer, sizeof buffer, " %.3f ± %.3f", m, e);
        table += buffer;
        if (&row != &rows.front()) {
          const auto& base = scores[rows.front().name + " " + std::to_string(n)];
          std::vector<double> gain;
          for (std::size_t i = 0; i < cell.size(); ++i) gain.push_back(cell[i] - base[i]);
          const auto [g, ge] = mean_and_error(gain);
          std::snprintf(buffer, sizeof buffer, " (%+.3f ± %.3f)", g, ge);
          table += buffer;
        }
        table += " |";
      }
    }
    std::printf("%s\n", table.c_str());
    std::ofstream(output) << nlohmann::json{{"meta",
                                             {{"weights", weights_path},
                                              {"seeds", seeds},
                                              {"length", T},
                                              {"reference", "ode, " + std::to_string(reference_steps) +
                                                                " steps, karras, self-condition previous"},
                                              {"baseline", rows.front().name},
                                              {"cpu", cpu_features().brand}}},
                                            {"per_seed", per_seed},
                                            {"table", table}}
                                .dump(1);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ldlm_solver_variants: %s\n", e.what());
    return 1;
  }
}

// A time grid fitted to the model (docs/model.md §Time grids, "fitted"), two ways:
// - `dp`, in the manner of GITS (Chen et al. 2024) and DM-NonUniform (Xue et al. 2024): the
//   N-step grid that minimises the summed local error of the solver's steps along fine
//   reference trajectories, by dynamic programming over a fine set of candidate times;
// - `end-to-end`, after LD3 (Tong et al. 2025) without derivatives: the grid that minimises
//   the final error of the real solver run on it (research/time_grid_search.hpp).
//
//   ldlm_fit_time_grid --weights W.safetensors --output R.json [--fit-seeds 100-131]
//       [--eval-seeds 0-7] [--length T] [--steps 6,8,10,15] [--reference-steps N]
//       [--methods dp,end-to-end,decoupled] [--candidates M] [--norms alpha,x,sigma] [--histories 0,1]
//       [--budget E] [--margin-temperature τ] [--samplers ipndm,...] [--self-conditions extrapolated,...] [--threads N]
//       [--write-metadata W.safetensors]
//   ldlm_fit_time_grid --grids-from R.json --write-metadata W.safetensors
//
// 1. Reference: for every seed, Euler on the probability-flow ODE (`ode`) with N uniform
//    steps from the seed's noise, the reference of research/results/calls-demo-*.md. At M
//    candidate times (a subset of its grid: t = 1, t_min, and the rest evenly spaced in
//    λ) it keeps x_ref and the denoiser's x̂0 there, D_ref.
// 2. dp. Cost of a step from candidate i to j: the data-prediction solver's step from
//    x_ref(t_i) with D_ref(t_i), against x_ref(t_j). With history 1 the step is
//    DPM-Solver++(2M)'s, whose slope also reads D_ref at the previous node k, so the dynamic
//    programme runs on pairs (k, i); with history 0 it is ddim's (GITS's choice). The norm is
//    per position (as research::per_position_error says why): the RMS over a position's d
//    values of the error, scaled by w(t_j), averaged over positions and seeds. w is 1/α (alpha: the error in the
//    data's units, x/α; no contraction assumed), 1 (x) or 1/σ (sigma: the error relative to
//    the noise, as if the denoiser ignored x).
// 3. end-to-end. The objective of a grid is the first sampler with the first self-condition
//    run on it from every fitting seed's noise, its x(t_min) against x_ref(t_min), per
//    position as above, averaged over the fitting seeds; one evaluation is N calls per seed.
//    At t_min the three norms differ by a constant factor, so there is one; and it is
//    smooth in the times, where the share of equal ids is a step function of them. The grid
//    is the N − 1 logs of its gaps in λ (LambdaGaps: any gaps double resolves make a valid
//    grid), searched by compass search from the λ grid, steps from 0.5 (a gap times e^±0.5)
//    down to 1/32, at most E evaluations.
//    decoupled: the same, with the time given to the denoiser at each step decoupled from the
//    step's grid time (SolverSettings::model_times, LD3's decoupled model time): N − 1 more
//    numbers, the offsets in λ of the calls after the first (research::DecoupledGrid),
//    searched jointly with the gaps from zero offsets on the λ grid.
//    margin: the grid alone as in end-to-end, scored instead by a smooth share of ids that
//    differ from the reference's (Fitter::margin_loss, temperature --margin-temperature τ in
//    logits): nearer the metric than the latent error, which also counts moves that flip no id.
// 4. Every fit, Karras' grid and the λ grid are run with the real solvers on the fitting seeds
//    and on the evaluation seeds (disjoint), as the share of decoded ids at x(t_min) equal to
//    the reference's. For each N, the fit best on the *fitting* seeds with the first sampler
//    and self-condition is the one written.
// 5. --write-metadata rewrites W's safetensors header with `ldlm.time_grid.<N>` = JSON list
//    of the N + 1 times (kTimeGridMetadataPrefix), and for a decoupled fit `ldlm.model_time.<N>`
//    = JSON list of its N model times (kModelTimeMetadataPrefix); the tensor bytes and their offsets are
//    untouched (the data section follows the header, and offsets count from its start).
//    --grids-from R.json writes the grids an earlier run chose (R's "chosen") and fits nothing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ldlm/io/state_dict.hpp"
#include "ldlm/ldlm.hpp"

#include "eval_args.hpp"
#include "time_grid_search.hpp"

namespace {

using namespace ldlm;
using bench::arg;
using bench::seed_list;
using bench::split;

struct Reference {
  std::vector<float> x, d;  // [candidates][n]: x_ref and D_ref at each candidate time
  std::vector<std::int64_t> ids;
};

struct Fitter {
  const LDLM<float>& model;
  Context& ctx;
  Index T;
  std::vector<double> fine;     // the reference's grid
  std::vector<int> candidates;  // indices into `fine`, from t = 1 down to t_min
  Index n() const { return T * model.config.d_model; }

  std::vector<std::int64_t> tokens(const std::vector<float>& latents) const {
    Tensor3<float> z(1, T, model.config.d_model);
    std::copy(latents.begin(), latents.end(), z.data());
    const TokenTensor ids = Pipeline<float>(model).decode_tokens(ctx, z);
    return {ids.data(), ids.data() + ids.size()};
  }

  /// The smooth share of ids that differ from `reference_ids` (margin): the mean over
  /// positions of σ(−m/τ), m the decoded logit of the reference's id less the largest other
  /// logit. As τ → 0 it is the share of differing ids; a position far from flipping counts
  /// almost 0 or 1, one near flipping in proportion to how near.
  double margin_loss(const std::vector<float>& latents, const std::vector<std::int64_t>& reference_ids,
                     double temperature) const {
    Tensor3<float> z(1, T, model.config.d_model);
    std::copy(latents.begin(), latents.end(), z.data());
    const Decoded<float> decoded = Pipeline<float>(model).decode(ctx, z);
    const Index V = decoded.logits.dimension(2);
    double sum = 0;
    for (Index p = 0; p < T; ++p) {
      const float* row = decoded.logits.data() + p * V;
      const std::int64_t id = reference_ids[std::size_t(p)];
      double other = -std::numeric_limits<double>::infinity();
      for (Index v = 0; v < V; ++v)
        if (v != id) other = std::max(other, double(row[v]));
      sum += 1.0 / (1.0 + std::exp((double(row[id]) - other) / temperature));
    }
    return sum / double(T);
  }

  /// The sample at t_min of `kind` on `times` from the noise of `seed`; with `keep`, the
  /// x and x̂0 of every call whose index is a candidate's.
  std::vector<float> run(std::uint64_t seed, SamplerKind kind, SelfCondition self_condition,
                         const std::vector<double>& times, Reference* keep = nullptr,
                         const std::vector<double>& model_times = {}) const {
    const TangentSchedule schedule = TangentSchedule::from_config(model.config);
    const Index size = n();
    std::vector<float> x(size);
    NormalGenerator rng(seed);
    rng.fill(x.data(), size);
    Arena::Scope scope(ctx.arena());
    const DenoiserCall<float> call(ctx, model.denoiser, 1, T);
    int index = 0;
    std::size_t next_candidate = 0;
    const auto denoise = [&](const float* at, double t, const float* self_cond, float* x0) {
      call(at, t, self_cond, x0);
      if (keep && next_candidate < candidates.size() && candidates[next_candidate] == index) {
        std::copy(at, at + size, keep->x.begin() + next_candidate * size);
        std::copy(x0, x0 + size, keep->d.begin() + next_candidate * size);
        ++next_candidate;
      }
      ++index;
    };
    SolverSettings settings;
    settings.kind = kind;
    settings.self_condition = self_condition;
    settings.model_times = model_times;
    integrate<float>(denoise, settings, schedule, times, size, x.data(), rng, ctx.arena());
    if (keep) {  // t_min: the result, where no call is made
      std::copy(x.begin(), x.end(), keep->x.begin() + (candidates.size() - 1) * size);
      keep->ids = tokens(x);
    }
    return x;
  }

  Reference reference(std::uint64_t seed) const {
    Reference r;
    r.x.resize(candidates.size() * n());
    r.d.resize(candidates.size() * n());
    run(seed, SamplerKind::ode, SelfCondition::previous, fine, &r);
    return r;
  }

  double agreement(std::uint64_t seed, SamplerKind kind, SelfCondition self_condition, const std::vector<double>& times,
                   const std::vector<double>& model_times, const std::vector<std::int64_t>& reference_ids) const {
    const auto ids = tokens(run(seed, kind, self_condition, times, nullptr, model_times));
    std::size_t same = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) same += ids[i] == reference_ids[i];
    return static_cast<double>(same) / static_cast<double>(ids.size());
  }
};

enum class Norm { alpha, x, sigma };

Norm parse_norm(const std::string& name) {
  if (name == "alpha") return Norm::alpha;
  if (name == "x") return Norm::x;
  if (name == "sigma") return Norm::sigma;
  throw InvalidArgument("ldlm_fit_time_grid: --norms: unknown '" + name + "' (alpha, x, sigma)");
}

/// The local error of every step between candidates, for one norm: cost(k, i, j) of the
/// step from i to j whose history is node k (k = i: none, ddim's step).
struct Costs {
  int m = 0;
  std::vector<double> c;  // [k][i][j]
  double& at(int k, int i, int j) { return c[(std::size_t(k) * m + i) * m + j]; }
  double at(int k, int i, int j) const { return c[(std::size_t(k) * m + i) * m + j]; }
};

Costs step_costs(const Fitter& f, const std::vector<Reference>& refs, Norm norm, bool history) {
  const TangentSchedule schedule = TangentSchedule::from_config(f.model.config);
  const int m = static_cast<int>(f.candidates.size());
  const Index n = f.n(), d = f.model.config.d_model, positions = n / d;
  Costs costs{m, std::vector<double>(std::size_t(m) * m * m, std::numeric_limits<double>::infinity())};
  std::vector<double> base(n);
  for (int i = 0; i + 1 < m; ++i) {
    const double t_i = f.fine[f.candidates[i]];
    for (int j = i + 1; j < m; ++j) {
      const double t_j = f.fine[f.candidates[j]];
      const ExponentialStep e = ExponentialStep::between(schedule, t_i, t_j);
      const double cx = e.sigma_ratio, cd = e.alpha_next * -std::expm1(-e.h);
      const double w = norm == Norm::alpha   ? 1.0 / schedule.alpha(t_j)
                       : norm == Norm::sigma ? 1.0 / schedule.sigma(t_j)
                                             : 1.0;
      // k = i stands for "no usable history": ddim's step (also every step from t = 1, and
      // the second step, whose history sits at λ = −∞); k in [1, i) is the previous node.
      for (int k = history && i > 0 ? 1 : i; k <= i; ++k) {
        const double slope =
            k == i ? 0.0 : 0.5 * e.h / (schedule.lambda(t_i) - schedule.lambda(f.fine[f.candidates[k]]));
        double sum = 0;
        for (const Reference& r : refs) {
          const float *xi = &r.x[i * n], *di = &r.d[i * n], *xj = &r.x[j * n];
          const float* dk = &r.d[k * n];
          for (Index p = 0; p < positions; ++p) {
            double sq = 0;
            for (Index q = p * d; q < (p + 1) * d; ++q) {
              const double dd = double(di[q]);
              const double step = cx * double(xi[q]) + cd * (dd + slope * (dd - double(dk[q])));
              const double err = step - double(xj[q]);
              sq += err * err;
            }
            sum += std::sqrt(sq / double(d));
          }
        }
        costs.at(k, i, j) = w * sum / double(positions * refs.size());
      }
    }
  }
  return costs;
}

/// The N-step path from candidate 0 (t = 1) to the last (t_min) of least summed cost; the
/// state is the last two nodes (k, i), k = i while the step has no usable history.
std::vector<int> best_path(const Costs& costs, int steps, bool history) {
  const int m = costs.m;
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][k][i]: the least cost of s steps ending at i with previous node k.
  std::vector<std::vector<double>> best(steps + 1, std::vector<double>(std::size_t(m) * m, inf));
  std::vector<std::vector<int>> from(steps + 1, std::vector<int>(std::size_t(m) * m, -1));
  const auto idx = [m](int k, int i) { return std::size_t(k) * m + i; };
  best[0][idx(0, 0)] = 0;
  for (int s = 0; s < steps; ++s)
    for (int k = 0; k < m; ++k)
      for (int i = k; i < m; ++i) {
        const double here = best[s][idx(k, i)];
        if (!std::isfinite(here)) continue;
        for (int j = i + 1; j < m; ++j) {
          // The history of step i → j is node k when it is usable: a real earlier node after
          // t = 1 (k > 0, k < i). Otherwise ddim's cost, at (i, i, j).
          const bool usable = history && k > 0 && k < i;
          const double c = usable ? costs.at(k, i, j) : costs.at(i, i, j);
          const double total = here + c;
          // From t = 1 (i = 0) the next state has no usable history: (j's previous) = 0.
          const std::size_t to = idx(i, j);
          if (total < best[s + 1][to]) {
            best[s + 1][to] = total;
            from[s + 1][to] = k;
          }
        }
      }
  int best_k = -1;
  double least = inf;
  for (int k = 0; k < m - 1; ++k)
    if (best[steps][idx(k, m - 1)] < least) least = best[steps][idx(k, m - 1)], best_k = k;
  if (best_k < 0) throw Error("ldlm_fit_time_grid: no path of " + std::to_string(steps) + " steps");
  std::vector<int> path = {m - 1, best_k};
  int k = best_k, i = m - 1;
  for (int s = steps; s > 1; --s) {
    const int previous = from[s][idx(k, i)];
    path.push_back(previous);
    i = k;
    k = previous;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

/// Rewrites the safetensors header of `path` with every ldlm.time_grid.* and ldlm.model_time.*
/// entry replaced by `grids` and `model_times`; the data section is copied byte for byte.
void write_metadata(const std::string& path, const std::map<int, std::vector<double>>& grids,
                    const std::map<int, std::vector<double>>& model_times) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("ldlm_fit_time_grid: cannot read '" + path + "'");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t length = 0;
  for (int b = 7; b >= 0; --b) length = (length << 8) | static_cast<unsigned char>(bytes.at(b));
  auto header = nlohmann::ordered_json::parse(bytes.begin() + 8, bytes.begin() + 8 + length);
  auto& meta = header["__metadata__"];
  for (auto it = meta.begin(); it != meta.end();)
    it = it.key().starts_with(kTimeGridMetadataPrefix) || it.key().starts_with(kModelTimeMetadataPrefix)
             ? meta.erase(it)
             : std::next(it);
  for (const auto& [steps, times] : grids)
    meta[std::string(kTimeGridMetadataPrefix) + std::to_string(steps)] = nlohmann::json(times).dump();
  for (const auto& [steps, times] : model_times)
    meta[std::string(kModelTimeMetadataPrefix) + std::to_string(steps)] = nlohmann::json(times).dump();
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section stays 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::uint64_t size = text.size();
  for (int b = 0; b < 8; ++b) out.put(static_cast<char>((size >> (8 * b)) & 0xff));
  out << text;
  out.write(bytes.data() + 8 + length, static_cast<std::streamsize>(bytes.size() - 8 - length));
  if (!out.flush()) throw IoError("ldlm_fit_time_grid: writing '" + path + "' failed");
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

}  // namespace

int main(int argc, char** argv) try {
  const std::vector<std::string> args(argv + 1, argv + argc);
  // --grids-from R.json --write-metadata W: the grids an earlier run chose, written into W
  // without fitting again (one fit, then an evaluation copy and the shipped file).
  if (const std::string from = arg(args, "grids-from", ""); !from.empty()) {
    const std::string target = arg(args, "write-metadata", "");
    if (target.empty()) throw InvalidArgument("ldlm_fit_time_grid: --grids-from needs --write-metadata");
    std::ifstream in(from);
    if (!in) throw IoError("ldlm_fit_time_grid: cannot read '" + from + "'");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const nlohmann::json run = read_json(text, [&](const JsonProblem& p) {
      throw InvalidArgument("ldlm_fit_time_grid: --grids-from '" + from + "': " + p.message);
    });
    // "chosen" and "chosen_model_times" are lists of [steps, [times]] pairs, as nlohmann
    // writes a map with int keys.
    std::map<int, std::vector<double>> grids, model_times;
    try {
      grids = run.at("chosen").get<std::map<int, std::vector<double>>>();
      if (run.contains("chosen_model_times"))
        model_times = run.at("chosen_model_times").get<std::map<int, std::vector<double>>>();
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgument(
          "ldlm_fit_time_grid: --grids-from '" + from +
          "': expected \"chosen\" (and \"chosen_model_times\"), lists of [steps, [times]] pairs: " + e.what());
    }
    write_metadata(target, grids, model_times);
    return 0;
  }
  const std::string weights_path = arg(args, "weights", ""), output = arg(args, "output", "");
  if (weights_path.empty() || output.empty()) {
    std::fprintf(
        stderr,
        "usage: ldlm_fit_time_grid --weights W.safetensors --output R.json [--fit-seeds 100-131]\n"
        "       [--eval-seeds 0-7] [--length T] [--steps 6,8,10,15] [--reference-steps N]\n"
        "       [--methods dp,end-to-end,decoupled] [--candidates M] [--norms alpha,x,sigma] [--histories 0,1]\n"
        "       [--budget E] [--margin-temperature τ] [--samplers a,b] [--self-conditions a,b] [--threads N]\n"
        "       [--write-metadata W.safetensors]\n"
        "       ldlm_fit_time_grid --grids-from R.json --write-metadata W.safetensors\n");
    return 2;
  }
  const SafetensorsFile file = SafetensorsFile::open(weights_path);
  const Config config = resolve_config(file, std::nullopt);
  LDLM<float> model(config);
  for (const auto name : {Denoiser<>::kName, LatentDecoder<>::kName, TokenDecoder<>::kName})
    load_module(model, file, name);
  Context ctx(std::stoi(arg(args, "threads", "1")));
  const TangentSchedule schedule = TangentSchedule::from_config(config);
  Fitter f{model, ctx, std::stoll(arg(args, "length", "64")), {}, {}};
  const int reference_steps = std::stoi(arg(args, "reference-steps", "2000"));
  // The reference of research/results/calls-demo-*.md: `ldlm generate --sampler ode --steps
  // 2000`, on the default grid, Karras'.
  f.fine = time_grid(reference_steps, config.t_min, schedule, TimeGridOptions{TimeGrid::karras});
  // Candidates: t = 1, t_min, and the rest evenly spaced in λ between the fine grid's
  // second time and t_min, each snapped to the time of the fine grid nearest in λ.
  const int wanted = std::stoi(arg(args, "candidates", "72"));
  const double l_first = schedule.lambda(f.fine[1]), l_last = schedule.lambda(config.t_min);
  f.candidates.push_back(0);
  for (int c = 0; c < wanted - 1; ++c) {
    const double target = l_first + (l_last - l_first) * c / (wanted - 2);
    int index = 1;
    for (int k = 1; k <= reference_steps; ++k)
      if (std::abs(schedule.lambda(f.fine[k]) - target) < std::abs(schedule.lambda(f.fine[index]) - target)) index = k;
    if (index > f.candidates.back()) f.candidates.push_back(index);
  }
  if (f.candidates.back() != reference_steps) f.candidates.push_back(reference_steps);

  bool dp = false, end_to_end = false, decoupled = false, margin = false;
  for (const auto& method : split(arg(args, "methods", "dp"))) {
    if (method == "dp")
      dp = true;
    else if (method == "end-to-end")
      end_to_end = true;
    else if (method == "decoupled")
      decoupled = true;
    else if (method == "margin")
      margin = true;
    else
      throw InvalidArgument("ldlm_fit_time_grid: --methods: unknown '" + method +
                            "' (dp, end-to-end, decoupled, margin)");
  }
  const int budget = std::stoi(arg(args, "budget", "150"));
  const double temperature = std::stod(arg(args, "margin-temperature", "0.3"));
  std::vector<int> step_counts;
  for (const auto& s : split(arg(args, "steps", "6,8,10,15"))) step_counts.push_back(std::stoi(s));
  std::vector<Norm> norms;
  std::vector<std::string> norm_names = split(arg(args, "norms", "alpha,x,sigma"));
  for (const auto& name : norm_names) norms.push_back(parse_norm(name));
  std::vector<int> histories;
  for (const auto& h : split(arg(args, "histories", "0,1"))) histories.push_back(std::stoi(h));
  std::vector<SamplerKind> samplers;
  for (const auto& name : split(arg(args, "samplers", "ipndm"))) samplers.push_back(find_sampler(name).value());
  std::vector<SelfCondition> self_conditions;
  std::vector<std::string> self_condition_names = split(arg(args, "self-conditions", "extrapolated"));
  for (const auto& name : self_condition_names) {
    const auto* choice = detail::find_named(kSelfConditions, name);
    if (!choice) throw InvalidArgument("ldlm_fit_time_grid: --self-conditions: unknown '" + name + "'");
    self_conditions.push_back(choice->value);
  }
  const std::vector<std::uint64_t> fit_seeds = seed_list(arg(args, "fit-seeds", "100-131"));
  const std::vector<std::uint64_t> eval_seeds = seed_list(arg(args, "eval-seeds", "0-7"));

  std::vector<Reference> fit_refs, eval_refs;
  for (const auto s : fit_seeds) fit_refs.push_back(f.reference(s));
  std::fprintf(stderr, "references of %zu fitting seeds done, %zu candidates\n", fit_refs.size(), f.candidates.size());
  for (const auto s : eval_seeds) {
    Reference r;
    r.ids = f.tokens(f.run(s, SamplerKind::ode, SelfCondition::previous, f.fine));
    eval_refs.push_back(std::move(r));
  }

  nlohmann::json out;
  out["meta"] = {{"model", weights_path},
                 {"length", f.T},
                 {"reference_steps", reference_steps},
                 {"candidates", f.candidates.size()},
                 {"fit_seeds", fit_seeds},
                 {"eval_seeds", eval_seeds},
                 {"cpu", cpu_features().brand},
                 {"cpu_family", cpu_features().family},
                 {"cpu_model", cpu_features().model}};
  // The grids to compare: Karras' (the default's) and every fit, per step count.
  struct Candidate {
    std::string name;
    int steps;
    std::vector<double> times;
    std::vector<double> model_times = {};  // empty: the grid's own
  };
  std::vector<Candidate> grids;
  for (const int steps : step_counts) {
    grids.push_back({"karras", steps, time_grid(steps, config.t_min, schedule, TimeGridOptions{TimeGrid::karras})});
    grids.push_back({"lambda", steps, time_grid(steps, config.t_min, schedule, TimeGridOptions{TimeGrid::lambda})});
  }
  for (std::size_t a = 0; a < norms.size() && dp; ++a)
    for (const int history : histories) {
      const Costs costs = step_costs(f, fit_refs, norms[a], history != 0);
      for (const int steps : step_counts) {
        std::vector<double> times;
        for (const int node : best_path(costs, steps, history != 0)) times.push_back(f.fine[f.candidates[node]]);
        grids.push_back({"fit-" + norm_names[a] + "-h" + std::to_string(history), steps, times});
      }
    }

  if (end_to_end || decoupled || margin) {
    const research::LambdaGaps gaps{schedule, config.t_min};
    const research::DecoupledGrid decoupling{gaps};
    // Each fitting seed's converged x(t_min), the reference's last candidate.
    std::vector<std::vector<float>> finals;
    const std::size_t final_offset = (f.candidates.size() - 1) * std::size_t(f.n());
    for (const Reference& r : fit_refs) finals.emplace_back(r.x.begin() + final_offset, r.x.end());
    const std::size_t d = std::size_t(model.config.d_model);
    const double weight = 1.0 / schedule.alpha(config.t_min);
    const auto run = [&](std::size_t i, std::span<const double> times) {
      return f.run(fit_seeds[i], samplers[0], self_conditions[0], {times.begin(), times.end()});
    };
    const auto grid_objective = [&](const std::vector<double>& log_gaps) {
      return research::end_to_end_objective(gaps, run, finals, d, weight, log_gaps);
    };
    // decoupled: the grid and its model times searched together, from the λ grid's own times.
    const auto decoupled_objective = [&](const std::vector<double>& parameters) {
      const std::vector<double> times = decoupling.times(parameters), model_times = decoupling.model_times(parameters);
      if (!research::LambdaGaps::representable(times) ||
          !(*std::min_element(model_times.begin(), model_times.end()) > 0))
        return std::numeric_limits<double>::infinity();
      const auto run_decoupled = [&](std::size_t i, std::span<const double>) {
        return f.run(fit_seeds[i], samplers[0], self_conditions[0], times, nullptr, model_times);
      };
      return research::end_to_end_error(run_decoupled, finals, d, weight, times);
    };
    // margin: the grid alone again, scored by the smooth share of differing ids (margin_loss).
    const auto margin_objective = [&](const std::vector<double>& log_gaps) {
      const std::vector<double> times = gaps.times(log_gaps);
      if (!research::LambdaGaps::representable(times)) return std::numeric_limits<double>::infinity();
      double sum = 0;
      for (std::size_t i = 0; i < fit_seeds.size(); ++i)
        sum += f.margin_loss(run(i, times), fit_refs[i].ids, temperature);
      return sum / double(fit_seeds.size());
    };
    enum class Search { grid, joint, margin };
    for (const int steps : step_counts)
      for (const Search search : {Search::grid, Search::joint, Search::margin}) {
        const bool joint = search == Search::joint;
        if (!(search == Search::grid ? end_to_end : joint ? decoupled : margin)) continue;
        const std::vector<double> lambda = time_grid(steps, config.t_min, schedule, TimeGridOptions{TimeGrid::lambda});
        const auto objective = [&](const std::vector<double>& x) {
          return joint ? decoupled_objective(x) : search == Search::margin ? margin_objective(x) : grid_objective(x);
        };
        const std::vector<double> start = joint ? decoupling.parameters(lambda) : gaps.log_gaps(lambda);
        const double start_value = objective(start);
        const char* method = joint ? "decoupled" : search == Search::margin ? "margin" : "end-to-end";
        const auto report = [&](const research::SearchResult& r) {
          std::fprintf(stderr, "%s %2d steps: %4d evaluations, error %.5f (λ grid %.5f)\n", method, steps,
                       r.evaluations, r.value, start_value);
        };
        const research::SearchResult found = research::compass_search(objective, start, 0.5, 1.0 / 32, budget, report);
        out[joint                      ? "decoupled"
            : search == Search::margin ? "margin"
                                       : "end_to_end"]
            .push_back({{"steps", steps},
                        {"evaluations", found.evaluations},
                        {"error_lambda", start_value},
                        {"error_fitted", found.value},
                        {joint ? "parameters" : "log_gaps", found.x}});
        if (joint)
          grids.push_back({"fit-decoupled", steps, decoupling.times(found.x), decoupling.model_times(found.x)});
        else
          grids.push_back({search == Search::margin ? "fit-margin" : "fit-end-to-end", steps, gaps.times(found.x)});
      }
  }

  std::map<int, std::pair<double, const Candidate*>> chosen;  // steps -> (fit agreement, grid)
  for (const Candidate& g : grids)
    for (std::size_t s = 0; s < samplers.size(); ++s)
      for (std::size_t c = 0; c < self_conditions.size(); ++c) {
        std::vector<double> on_fit, on_eval;
        for (std::size_t i = 0; i < fit_seeds.size(); ++i)
          on_fit.push_back(
              f.agreement(fit_seeds[i], samplers[s], self_conditions[c], g.times, g.model_times, fit_refs[i].ids));
        for (std::size_t i = 0; i < eval_seeds.size(); ++i)
          on_eval.push_back(
              f.agreement(eval_seeds[i], samplers[s], self_conditions[c], g.times, g.model_times, eval_refs[i].ids));
        const std::string sampler_name(sampler_info(samplers[s]).name);
        out["runs"].push_back({{"grid", g.name},
                               {"steps", g.steps},
                               {"sampler", sampler_name},
                               {"self_condition", self_condition_names[c]},
                               {"times", g.times},
                               {"model_times", g.model_times},
                               {"agreement_fit", mean(on_fit)},
                               {"agreement_eval", on_eval.empty() ? nlohmann::json() : nlohmann::json(mean(on_eval))},
                               {"per_seed_fit", on_fit},
                               {"per_seed_eval", on_eval}});
        std::fprintf(stderr, "%-16s %2d steps  %-10s %-12s fit %.3f  eval %.3f\n", g.name.c_str(), g.steps,
                     sampler_name.c_str(), self_condition_names[c].c_str(), mean(on_fit),
                     on_eval.empty() ? 0.0 : mean(on_eval));
        if (s == 0 && c == 0 && g.name.starts_with("fit-") &&
            (!chosen.count(g.steps) || mean(on_fit) > chosen[g.steps].first))
          chosen[g.steps] = {mean(on_fit), &g};
      }
  std::map<int, std::vector<double>> written, written_model_times;
  for (const auto& [steps, best] : chosen) {
    written[steps] = best.second->times;
    if (!best.second->model_times.empty()) written_model_times[steps] = best.second->model_times;
  }
  out["chosen"] = written;
  out["chosen_model_times"] = written_model_times;
  std::ofstream(output) << out.dump(1) << "\n";
  const std::string target = arg(args, "write-metadata", "");
  if (!target.empty()) write_metadata(target, written, written_model_times);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ldlm_fit_time_grid: %s\n", e.what());
  return 1;
}

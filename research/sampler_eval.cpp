// Sampling quality per denoiser call (docs/model.md §Choosing the default): every
// sampler × time grid × step count against a converged reference from the same noise.
//
//   ldlm_sampler_eval [--weights W.safetensors | --init-seed S] [--length T] [--seeds K]
//                     [--reference-steps N] [--calls 4,6,...] [--samplers a,b] [--grids a,b]
//                     [--sigma-max R] [--rho P] [--self-conditions previous,extrapolated]
//                     [--threads N] --output results.json
//
// For each seed, the reference is the exact probability-flow ODE solved by dpmpp-2m on the
// uniform grid with N and 2N steps; the tool reports how far the two agree, which bounds
// what the figures below can resolve. Euler's ODE uses a clipped β and so solves another
// ODE: its own reference (ode with N steps) is reported beside it. Each run gives, at both
// endpoints (the last x̂0 and x at t_min), the latent RMSE against the reference's same
// endpoint and the share of decoded token ids that agree with the reference's. Stochastic
// samplers are compared the same way (they cannot converge to the ODE's sample; the
// figure shows how far they stray) and their decoded texts are written for
// research/samplers.py, which adds the dictionary-word share and renders the report.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ldlm/io/state_dict.hpp"
#include "ldlm/io/tokenizer.hpp"
#include "ldlm/ldlm.hpp"

#include "eval_args.hpp"

namespace {

using namespace ldlm;
using bench::arg;
using bench::split;

struct Run {
  std::vector<float> sample, denoised;  // the two endpoints
  double seconds = 0, denoiser_seconds = 0;
  int calls = 0;
};

struct Evaluator {
  const LDLM<float>& model;
  Context& ctx;
  Index T;

  Run run(std::uint64_t seed, SamplerKind kind, const TimeGridOptions& grid, int steps,
          HeunSelfCondition heun = HeunSelfCondition::latest,
          SelfCondition self_condition = SelfCondition::previous) const {
    const Config& c = model.config;
    const Index n = T * c.d_model;
    const TangentSchedule schedule = TangentSchedule::from_config(c);
    const std::vector<double> times = time_grid(steps, c.t_min, schedule, grid);
    Run r;
    r.sample.resize(n);
    r.denoised.resize(n);
    NormalGenerator rng(seed);
    rng.fill(r.sample.data(), n);
    Arena::Scope scope(ctx.arena());
    const DenoiserCall<float> call(ctx, model.denoiser, 1, T);
    double denoiser_seconds = 0;
    const auto denoise = [&](const float* x, double t, const float* self_cond, float* x0) {
      const auto start = std::chrono::steady_clock::now();
      call(x, t, self_cond, x0);
      denoiser_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    SolverHooks<float> hooks;
    hooks.on_denoised = [&](double, float* x0) { std::copy(x0, x0 + n, r.denoised.data()); };
    SolverSettings settings;
    settings.kind = kind;
    settings.endpoint = Endpoint::sample;
    settings.heun_self_condition = heun;
    settings.self_condition = self_condition;
    const auto start = std::chrono::steady_clock::now();
    const SamplingStats stats =
        integrate<float>(denoise, settings, schedule, times, n, r.sample.data(), rng, ctx.arena(), hooks);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.denoiser_seconds = denoiser_seconds;
    r.calls = stats.denoiser_calls;
    return r;
  }

  std::vector<std::int64_t> tokens(const std::vector<float>& latents) const {
    Tensor3<float> z(1, T, model.config.d_model);
    std::copy(latents.begin(), latents.end(), z.data());
    const TokenTensor ids = Pipeline<float>(model).decode_tokens(ctx, z);
    return {ids.data(), ids.data() + ids.size()};
  }
};

/// Every (a, b) of a × b.
template <class A, class B>
std::vector<std::pair<A, B>> pairs(const std::vector<A>& as, const std::vector<B>& bs) {
  std::vector<std::pair<A, B>> out;
  for (const A& a : as)
    for (const B& b : bs) out.emplace_back(a, b);
  return out;
}

double rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

double agreement(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

}  // namespace

int main(int argc, char** argv) try {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const std::string weights_path = arg(args, "weights", "");
  const std::string init_seed = arg(args, "init-seed", "");
  const std::string output = arg(args, "output", "");
  if (output.empty() || (weights_path.empty() == init_seed.empty())) {
    std::fprintf(stderr,
                 "usage: ldlm_sampler_eval (--weights W.safetensors | --init-seed S) --output R.json [--length T]\n"
                 "       [--seeds K] [--reference-steps N] [--calls 4,6,..] [--samplers a,b] [--grids a,b]\n"
                 "       [--sigma-max R] [--rho P] [--self-conditions a,b] [--threads N] [--tokenizer DIR]\n");
    return 2;
  }
  const Index T = std::stoll(arg(args, "length", "64"));
  const int seeds = std::stoi(arg(args, "seeds", "8"));
  const int reference_steps = std::stoi(arg(args, "reference-steps", "1000"));
  const double sigma_max = std::stod(arg(args, "sigma-max", "0"));
  const double rho = std::stod(arg(args, "rho", "7"));
  std::vector<int> calls;
  for (const auto& c : split(arg(args, "calls", "4,6,8,10,15,20,30,50,100"))) calls.push_back(std::stoi(c));
  std::vector<SamplerKind> samplers;
  for (const auto& name : split(arg(args, "samplers", sampler_names(","))))
    samplers.push_back(find_sampler(name).value());
  std::vector<TimeGrid> grids;
  for (const auto& name : split(arg(args, "grids", time_grid_names(","))))
    grids.push_back(find_time_grid(name).value());

  std::vector<SelfCondition> self_conditions;
  for (const auto& name : split(arg(args, "self-conditions", "previous"))) {
    const auto* choice = detail::find_named(kSelfConditions, name);
    if (!choice) throw InvalidArgument("ldlm_sampler_eval: --self-conditions: unknown '" + name + "'");
    self_conditions.push_back(choice->value);
  }

  std::optional<SafetensorsFile> file;
  Config config;
  if (!weights_path.empty()) {
    file = SafetensorsFile::open(weights_path);
    config = resolve_config(*file, std::nullopt);
  }
  LDLM<float> model(config);
  const std::uint64_t seed = init_seed.empty() ? kDefaultInitSeed : std::stoull(init_seed);
  for (const auto name : {Denoiser<>::kName, LatentDecoder<>::kName, TokenDecoder<>::kName})
    load_or_init_module(model, file, name, seed);
  Context ctx(std::stoi(arg(args, "threads", "1")));
  const Evaluator eval{model, ctx, T};
  const std::string tokenizer_dir = arg(args, "tokenizer", "");
  std::optional<Tokenizer> tokenizer;
  if (!tokenizer_dir.empty()) tokenizer = Tokenizer::load(tokenizer_dir);

  nlohmann::json out;
  out["meta"] = {{"model", weights_path.empty() ? "generator weights, seed " + init_seed : weights_path},
                 {"length", T},
                 {"seeds", seeds},
                 {"reference_steps", reference_steps},
                 {"sigma_max", sigma_max},
                 {"rho", rho},
                 {"cpu", cpu_features().brand},
                 {"cpu_family", cpu_features().family},
                 {"cpu_model", cpu_features().model},
                 {"threads", ctx.threads()}};

  struct Reference {
    Run run;
    std::vector<std::int64_t> sample_ids, denoised_ids;
  };
  auto reference = [&](std::uint64_t s, SamplerKind kind, int steps) {
    Reference r{eval.run(s, kind, TimeGridOptions{TimeGrid::uniform}, steps), {}, {}};
    r.sample_ids = eval.tokens(r.run.sample);
    r.denoised_ids = eval.tokens(r.run.denoised);
    return r;
  };
  std::vector<Reference> refs, euler_refs;
  for (int s = 0; s < seeds; ++s) {
    refs.push_back(reference(s, SamplerKind::dpmpp_2m, reference_steps));
    const Reference twice = reference(s, SamplerKind::dpmpp_2m, 2 * reference_steps);
    euler_refs.push_back(reference(s, SamplerKind::ode, reference_steps));
    const Reference euler_twice = reference(s, SamplerKind::ode, 2 * reference_steps);
    out["reference"].push_back(
        {{"seed", s},
         {"agreement_n_2n_sample", agreement(refs.back().sample_ids, twice.sample_ids)},
         {"agreement_n_2n_denoised", agreement(refs.back().denoised_ids, twice.denoised_ids)},
         {"rmse_n_2n_sample", rmse(refs.back().run.sample, twice.run.sample)},
         {"euler_agreement_n_2n_sample", agreement(euler_refs.back().sample_ids, euler_twice.sample_ids)},
         {"euler_vs_exact_agreement_sample", agreement(euler_refs.back().sample_ids, refs.back().sample_ids)},
         {"endpoints_agreement", agreement(refs.back().sample_ids, refs.back().denoised_ids)},
         {"seconds_per_call", refs.back().run.denoiser_seconds / refs.back().run.calls}});
    std::fprintf(stderr, "reference seed %d: N vs 2N agree %.4f (sample), %.4f (denoised)\n", s,
                 double(out["reference"].back()["agreement_n_2n_sample"]),
                 double(out["reference"].back()["agreement_n_2n_denoised"]));
  }

  for (const SamplerKind kind : samplers) {
    const SamplerInfo& info = sampler_info(kind);
    for (const TimeGrid grid_kind : grids) {
      TimeGridOptions grid;
      grid.grid = grid_kind;
      grid.sigma_max = sigma_max;
      grid.rho = rho;
      for (const int nfe : calls) {
        const int steps = nfe / info.calls_per_step;
        if (steps < 1 || steps * info.calls_per_step != nfe) continue;
        std::vector<HeunSelfCondition> heun_choices = {HeunSelfCondition::latest};
        if (kind == SamplerKind::heun) heun_choices.push_back(HeunSelfCondition::step_start);
        for (const auto& [heun, self_condition] : pairs(heun_choices, self_conditions)) {
          const std::string_view self_condition_name =
              detail::info_of(kSelfConditions, &NamedChoice<SelfCondition>::value, self_condition, "").name;
          nlohmann::json row = {{"sampler", info.name},
                                {"grid", time_grid_info(grid_kind).name},
                                {"calls", nfe},
                                {"steps", steps},
                                {"heun_self_condition", heun == HeunSelfCondition::latest ? "latest" : "step_start"},
                                {"self_condition", self_condition_name}};
          double sums[6] = {0, 0, 0, 0, 0, 0};
          double solver_seconds = 0, total_seconds = 0;
          std::vector<std::string> texts;
          std::vector<std::vector<std::int64_t>> distinct;
          for (int s = 0; s < seeds; ++s) {
            const Run r = eval.run(s, kind, grid, steps, heun, self_condition);
            const auto& ref = kind == SamplerKind::ode || kind == SamplerKind::sde ? euler_refs[s] : refs[s];
            const auto sample_ids = eval.tokens(r.sample), denoised_ids = eval.tokens(r.denoised);
            sums[0] += rmse(r.sample, ref.run.sample);
            sums[1] += rmse(r.denoised, ref.run.denoised);
            sums[2] += agreement(sample_ids, ref.sample_ids);
            sums[3] += agreement(denoised_ids, ref.denoised_ids);
            // Against the exact ODE's reference whatever the sampler, for a common yardstick.
            sums[4] += agreement(sample_ids, refs[s].sample_ids);
            sums[5] += agreement(denoised_ids, refs[s].denoised_ids);
            solver_seconds += r.seconds - r.denoiser_seconds;
            total_seconds += r.seconds;
            if (tokenizer) {
              texts.push_back(tokenizer->decode(denoised_ids));
              texts.push_back(tokenizer->decode(sample_ids));
            }
            if (std::find(distinct.begin(), distinct.end(), denoised_ids) == distinct.end())
              distinct.push_back(denoised_ids);
          }
          row["rmse_sample"] = sums[0] / seeds;
          row["rmse_denoised"] = sums[1] / seeds;
          row["agreement_sample"] = sums[2] / seeds;
          row["agreement_denoised"] = sums[3] / seeds;
          row["agreement_exact_sample"] = sums[4] / seeds;
          row["agreement_exact_denoised"] = sums[5] / seeds;
          row["solver_share"] = solver_seconds / total_seconds;
          row["distinct_denoised"] = distinct.size();
          if (tokenizer) row["texts_denoised_sample"] = texts;
          std::fprintf(stderr, "%-13s %-8s %-12s %4d calls: agreement %.3f (sample %.3f), rmse %.4f (sample %.4f)\n",
                       std::string(info.name).c_str(), std::string(time_grid_info(grid_kind).name).c_str(),
                       std::string(self_condition_name).c_str(), nfe, double(row["agreement_denoised"]),
                       double(row["agreement_sample"]), double(row["rmse_denoised"]), double(row["rmse_sample"]));
          out["runs"].push_back(row);
        }
      }
    }
  }
  // Decoded texts may end inside a UTF-8 character.
  std::ofstream(output) << out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ldlm_sampler_eval: %s\n", e.what());
  return 1;
}

// ldlm serve: the HTTP routes (docs/server.md): the JSON endpoints over TextModel and
// the scheduler, the playground's static files, the API key, and every error as JSON
// {"error": {"message", "type", "field"}}.
#pragma once

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ldlm/text_model.hpp"
#include "metrics.hpp"
#include "peer.hpp"
#include "request.hpp"
#include "scheduler.hpp"
#include "sse.hpp"
#include "static_files.hpp"

namespace ldlm::server {

struct ServiceOptions {
  std::string model_name = "ldlm-demo";
  std::string api_key;  // "": no key
  int max_batch = 16, max_queue = 64, max_length = 0;
  Clock::duration batch_window = {};  // SchedulerOptions::batch_window
  double timeout = 60;                // seconds, from arrival to answer
  int threads = 0;
  RequestLimits limits;  // filled from the above and the library's names
};

/// The sampling endpoints, which differ in their request and their answer.
enum class SamplingKind { infill, generate, completions };

class Service {
 public:
  explicit Service(ServiceOptions options)
      : options_(std::move(options)),
        scheduler_({options_.max_batch, options_.max_queue, options_.threads, options_.batch_window}, metrics_),
        files_(static_files()),
        started_(std::time(nullptr)) {
    routes_ = {{"/health", {"GET"}},    {"/metrics", {"GET"}},    {"/v1/models", {"GET"}},
               {"/infill", {"POST"}},   {"/generate", {"POST"}},  {"/v1/completions", {"POST"}},
               {"/tokenize", {"POST"}}, {"/detokenize", {"POST"}}};
    for (const StaticFile& file : files_) routes_[file.path] = {"GET"};
  }

  /// The model is loaded: answer requests with it (it must outlive stop()).
  void ready(const TextModel& model) {
    scheduler_.start(model);
    model_.store(&model);
  }

  /// Before ready(): the positions a request may use.
  void set_max_length(int max_length) {
    options_.max_length = max_length;
    options_.limits.max_length = max_length;
  }

  /// After the HTTP server has stopped: runs what is queued, then ends the worker.
  void stop() { scheduler_.stop(); }

  void install(httplib::Server& server) {
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      request_start() = Clock::now();
      return pre_route(req, res);
    });
    server.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      // Statuses that httplib sets itself: 413 past --max-body, 400 for a malformed request.
      const ApiError error = res.status == 413
                                 ? ApiError(413, "request_too_large", "the request body is larger than --max-body")
                                 : ApiError(res.status, "http_error", "HTTP status " + std::to_string(res.status));
      res.set_content(error.body(), "application/json");
    });
    server.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::fprintf(stderr, "ldlm serve: %s %s: %s\n", req.method.c_str(), req.path.c_str(), what.c_str());
      reply(res, ApiError(500, "server_error", req.path + ": " + what));
    });
    server.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      const std::string endpoint = routes_.count(req.path) ? req.path : "other";
      std::optional<Clock::time_point>& start = request_start();
      const double seconds = start ? std::chrono::duration<double>(Clock::now() - *start).count() : 0.0;
      metrics_.request_done(endpoint, res.status, seconds);
      start.reset();
    });

    server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (!model()) {
        res.status = 503;
        res.set_content(R"({"status":"loading"})", "application/json");
        return;
      }
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.text(scheduler_.queue_depth(), scheduler_.running()),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      guarded(res, [&] { reply_json(res, models(require_model())); });
    });
    server.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        const TextModel& model = require_model();
        const TokenizeRequest r = parse_tokenize(req.body);
        reply_json(res, {{"ids", model.tokenize(r.text)}});
      });
    });
    server.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        const TextModel& model = require_model();
        const DetokenizeRequest r = parse_detokenize(req.body, options_.limits);
        const std::int64_t vocab = model.info().vocab_size;
        for (std::size_t i = 0; i < r.ids.size(); ++i)
          if (r.ids[i] >= vocab)
            throw bad_request("/detokenize",
                              "field 'ids[" + std::to_string(i) + "]' must be a token id below the vocabulary size " +
                                  std::to_string(vocab) + ", got " + std::to_string(r.ids[i]),
                              "ids");
        reply_json(res, {{"text", model.detokenize(r.ids)}});
      });
    });
    server.Post("/infill", [this](const httplib::Request& req, httplib::Response& res) {
      sample(req, res, SamplingKind::infill);
    });
    server.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) {
      sample(req, res, SamplingKind::generate);
    });
    server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      sample(req, res, SamplingKind::completions);
    });
    for (const StaticFile& file : files_)
      server.Get(exact_pattern(file.path), [&file](const httplib::Request&, httplib::Response& res) {
        res.set_content(file.bytes.data(), file.bytes.size(), file.content_type.c_str());
        res.set_header("X-Content-Type-Options", "nosniff");
      });
  }

  Metrics& metrics() { return metrics_; }

 private:
  /// What a route needs to build its answer from a request's samples.
  struct Shape {
    SamplingKind kind = SamplingKind::infill;
    std::size_t prompt_tokens = 0;  // completions: the ids before the generated ones
    int length = 0;                 // completions: the generated ids
    std::int64_t known = 0, masked = 0;
    std::string id;  // completions: "cmpl-..."
    std::int64_t created = 0;
  };

  static std::optional<Clock::time_point>& request_start() {
    thread_local std::optional<Clock::time_point> start;
    return start;
  }

  /// httplib matches a route as a regular expression: a file's name is escaped.
  static std::string exact_pattern(const std::string& path) {
    std::string out;
    for (const char c : path) {
      if (std::string_view(".+*?^$()[]{}|\\").find(c) != std::string_view::npos) out += '\\';
      out += c;
    }
    return out;
  }

  const TextModel* model() const { return model_.load(); }

  const TextModel& require_model() const {
    const TextModel* m = model();
    if (!m) throw ApiError(503, "unavailable", "the model is still loading; GET /health says when it is ready");
    return *m;
  }

  static void reply(httplib::Response& res, const ApiError& e) {
    res.status = e.status();
    if (e.status() == 429) res.set_header("Retry-After", "1");
    if (e.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
    res.set_content(e.body(), "application/json");
  }

  static void reply_json(httplib::Response& res, const nlohmann::json& body) {
    res.set_content(dump(body), "application/json");
  }

  static std::string dump(const nlohmann::json& body) {
    return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  template <class F>
  static void guarded(httplib::Response& res, F&& f) {
    try {
      f();
    } catch (const ApiError& e) {
      reply(res, e);
    } catch (const InvalidArgument& e) {
      reply(res, ApiError(400, "invalid_request_error", e.what()));
    }
  }

  /// 404 for an unknown path, 405 for a known path and another method, 401 without the
  /// API key (but for /health and the page's static files: a browser cannot send a header
  /// when it opens a page, and the files hold nothing but the page; its requests carry
  /// the key the person types).
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res) {
    const auto route = routes_.find(req.path);
    if (route == routes_.end()) {
      reply(res, ApiError(404, "not_found_error", "no endpoint " + req.path + " (docs/server.md lists them)"));
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::set<std::string>& methods = route->second;
    const bool head_of_get = req.method == "HEAD" && methods.count("GET");
    if (!methods.count(req.method) && !head_of_get) {
      std::string allow;
      for (const std::string& m : methods) allow += (allow.empty() ? "" : ", ") + m;
      res.set_header("Allow", allow);
      reply(res, ApiError(405, "method_not_allowed", req.method + " " + req.path + " is not allowed; use " + allow));
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool is_static =
        std::any_of(files_.begin(), files_.end(), [&](const StaticFile& file) { return file.path == req.path; });
    if (!options_.api_key.empty() && req.path != "/health" && !is_static && !authorized(req)) {
      reply(res, ApiError(401, "authentication_error",
                          "missing or wrong API key: send the header 'Authorization: Bearer <key>' (--api-key)"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }

  /// Compares in time independent of where the first difference is.
  bool authorized(const httplib::Request& req) const {
    const std::string expected = "Bearer " + options_.api_key;
    const std::string given = req.get_header_value("Authorization");
    unsigned char diff = given.size() == expected.size() ? 0 : 1;
    for (std::size_t i = 0; i < expected.size(); ++i)
      diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
    return diff == 0;
  }

  nlohmann::json models(const TextModel& model) const {
    const TextModelInfo info = model.info();
    const RequestLimits& l = options_.limits;
    return {{"object", "list"},
            {"data",
             {{{"id", options_.model_name},
               {"object", "model"},
               {"created", static_cast<std::int64_t>(started_)},
               {"owned_by", "ldlm"},
               {"ldlm",
                {{"samplers", l.samplers},
                 {"schedules", l.schedules},
                 {"methods", l.methods},
                 {"precisions", l.precisions},
                 {"max_positions", info.max_positions},
                 {"default_steps", 10},
                 {"max_steps", l.max_steps},
                 {"max_resample", l.max_resample},
                 {"max_length", l.max_length},
                 {"max_batch", options_.max_batch},
                 {"mask_id", info.mask_id},
                 {"mask", "<|mask|>"}}}}}}};
  }

  /// The body of a sampling request's answer (also the last event of its stream).
  nlohmann::json answer(const TextModel& model, const Shape& shape, const Job::Outcome& outcome) const {
    const TextSamples& samples = *outcome.samples;
    const std::int64_t n = static_cast<std::int64_t>(samples.ids.size());
    const nlohmann::json usage = {{"prompt_tokens", shape.known},
                                  {"completion_tokens", shape.masked * n},
                                  {"total_tokens", shape.known + shape.masked * n}};
    const TextTimings& t = outcome.timings;
    const double total_ms = outcome.queue_ms + t.total_ms;
    const nlohmann::json timings = {{"queue_ms", outcome.queue_ms},
                                    {"sample_ms", t.sample_ms},
                                    {"total_ms", total_ms},
                                    {"steps", t.steps},
                                    {"denoiser_calls", t.denoiser_calls},
                                    {"batch_sequences", outcome.batch_sequences},
                                    {"batch_requests", outcome.batch_requests}};
    if (shape.kind == SamplingKind::completions) {
      nlohmann::json choices = nlohmann::json::array();
      for (std::int64_t i = 0; i < n; ++i)
        choices.push_back({{"text", generated_text(model, shape, samples.ids[static_cast<std::size_t>(i)])},
                           {"index", i},
                           {"logprobs", nullptr},
                           {"finish_reason", "length"}});
      return {{"id", shape.id},           {"object", "text_completion"},
              {"created", shape.created}, {"model", options_.model_name},
              {"choices", choices},       {"usage", usage},
              {"timings", timings}};
    }
    return {{"object", shape.kind == SamplingKind::infill ? "ldlm.infill" : "ldlm.generation"},
            {"model", options_.model_name},
            {"texts", samples.texts},
            {"ids", samples.ids},
            {"usage", usage},
            {"timings", timings}};
  }

  /// The generated part of a completion: the ids between the prompt and the suffix.
  static std::string generated_text(const TextModel& model, const Shape& shape, const TokenIds& ids) {
    const std::size_t begin = std::min(shape.prompt_tokens, ids.size());
    const std::size_t end = std::min(begin + static_cast<std::size_t>(shape.length), ids.size());
    return model.detokenize(std::span(ids).subspan(begin, end - begin));
  }

  /// The payload of one step's event.
  std::string step_event(const TextModel& model, const Shape& shape, const TextStep& step,
                         std::span<const TokenIds> ids, std::span<const std::string> texts) const {
    nlohmann::json body;
    if (shape.kind == SamplingKind::completions) {
      nlohmann::json choices = nlohmann::json::array();
      for (std::size_t i = 0; i < ids.size(); ++i)
        choices.push_back({{"text", generated_text(model, shape, ids[i])},
                           {"index", i},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}});
      body = {{"id", shape.id},
              {"object", "text_completion"},
              {"created", shape.created},
              {"model", options_.model_name},
              {"choices", choices}};
    } else {
      body = {{"object", "ldlm.step"}};
    }
    body["step"] = step.step;
    body["steps"] = step.steps;
    body["t"] = step.t;
    body["texts"] = std::vector<std::string>(texts.begin(), texts.end());
    return dump(body);
  }

  /// The ids to sample for a request, its batch key and the shape of its answer.
  void sample(const httplib::Request& req, httplib::Response& res, SamplingKind kind) {
    try {
      const TextModel& model = require_model();
      const RequestLimits& limits = options_.limits;
      const std::string endpoint = req.path;
      SamplingFields fields;
      TokenIds ids;
      Shape shape;
      shape.kind = kind;
      if (kind == SamplingKind::infill) {
        InfillRequest r = parse_infill(req.body, limits);
        fields = r.sampling;
        if (r.text) {
          ids = model.tokenize_masked(*r.text);
        } else {
          ids = std::move(*r.ids);
          const std::int64_t vocab = model.info().vocab_size;
          for (std::size_t i = 0; i < ids.size(); ++i)
            if (ids[i] >= vocab)
              throw bad_request(endpoint,
                                "field 'ids[" + std::to_string(i) + "]' must be a token id below the vocabulary size " +
                                    std::to_string(vocab) + ", got " + std::to_string(ids[i]),
                                "ids");
        }
        const std::int64_t mask = model.info().mask_id;
        if (std::find(ids.begin(), ids.end(), mask) == ids.end())
          throw bad_request(endpoint,
                            r.text ? "field 'text' has no <|mask|> marker; each one marks a token position to fill"
                                   : "field 'ids' has no mask id " + std::to_string(mask) +
                                         "; each one marks a token position to fill",
                            r.text ? "text" : "ids");
      } else {
        const bool openai = kind == SamplingKind::completions;
        GenerateRequest r = parse_generate(endpoint, req.body, limits, openai);
        fields = r.sampling;
        ids = model.tokenize(r.prompt);
        shape.prompt_tokens = ids.size();
        shape.length = r.length;
        ids.insert(ids.end(), static_cast<std::size_t>(r.length), model.info().mask_id);
        const TokenIds suffix = model.tokenize(r.suffix);
        ids.insert(ids.end(), suffix.begin(), suffix.end());
        if (openai) {
          shape.id = "cmpl-" + std::to_string(started_) + "-" + std::to_string(++completions_);
          shape.created = static_cast<std::int64_t>(std::time(nullptr));
        }
      }
      const int max_length = limits.max_length;
      if (static_cast<std::int64_t>(ids.size()) > max_length)
        throw bad_request(endpoint,
                          "the request needs " + std::to_string(ids.size()) +
                              " token positions, more than --max-length " + std::to_string(max_length),
                          kind == SamplingKind::infill        ? "text"
                          : kind == SamplingKind::completions ? "max_tokens"
                                                              : "length");
      const std::int64_t mask = model.info().mask_id;
      shape.masked = std::count(ids.begin(), ids.end(), mask);
      shape.known = static_cast<std::int64_t>(ids.size()) - shape.masked;

      BatchKey key{ids.size(),       fields.sampler, fields.schedule, fields.method,
                   fields.precision, fields.steps,   fields.resample};
      auto job = std::make_shared<Job>(
          std::move(key), TextRequest{std::move(ids), fields.n, fields.seed},
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout)));
      if (fields.stream)
        job->format_step = [this, &model, shape](const TextStep& step, std::span<const TokenIds> step_ids,
                                                 std::span<const std::string> texts) {
          return step_event(model, shape, step, step_ids, texts);
        };
      scheduler_.submit(job);
      if (fields.stream)
        stream(res, model, shape, job);
      else
        wait(req, res, model, shape, *job);
    } catch (const ApiError& e) {
      reply(res, e);
    } catch (const InvalidArgument& e) {
      reply(res, ApiError(400, "invalid_request_error", req.path + ": " + e.what()));
    }
  }

  /// A bound on waiting for the worker: the request's deadline, and time for the step in
  /// progress then to end.
  static Clock::time_point give_up_at(const Job& job) { return job.deadline + std::chrono::seconds(30); }

  /// The answer of a request that is not streamed. While it waits, it looks every 100 ms
  /// whether its client has gone away (peer.hpp): then its request is abandoned, as a
  /// streamed one is when a write fails.
  void wait(const httplib::Request& req, httplib::Response& res, const TextModel& model, const Shape& shape, Job& job) {
    PeerWatch peer(req);
    std::optional<Job::Outcome> outcome;
    while (!outcome && Clock::now() < give_up_at(job)) {
      outcome = job.wait_outcome(std::min(give_up_at(job), Clock::now() + std::chrono::milliseconds(100)));
      if (!outcome && peer.gone()) {
        job.abandon();
        std::fprintf(stderr, "ldlm serve: a client went away; its request is cancelled\n");
        reply(res, ApiError(499, "cancelled", "the client went away"));
        return;
      }
    }
    if (!outcome) {
      job.abandon();
      reply(res, ApiError(504, "timeout", "the request took longer than --timeout and was given up"));
      return;
    }
    if (outcome->error) {
      reply(res, *outcome->error);
      return;
    }
    reply_json(res, answer(model, shape, *outcome));
  }

  /// The events of a streamed request: one per step, the answer, then [DONE]. A write that
  /// fails means the client went away: its request is abandoned.
  void stream(httplib::Response& res, const TextModel& model, const Shape& shape, std::shared_ptr<Job> job) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        std::string(kEventStreamType), [this, &model, shape, job](std::size_t, httplib::DataSink& sink) {
          const auto send = [&](const std::string& event) {
            if (sink.write(event.data(), event.size())) return true;
            job->abandon();
            std::fprintf(stderr, "ldlm serve: a streaming client went away; its request is cancelled\n");
            return false;
          };
          std::vector<std::string> events;
          while (true) {
            const std::optional<Job::Outcome> outcome = job->wait(give_up_at(*job), events);
            for (const std::string& payload : events)
              if (!send(sse_event(payload))) return false;
            if (!outcome) {
              if (Clock::now() < give_up_at(*job)) continue;
              job->abandon();
              const ApiError e(504, "timeout", "the request took longer than --timeout and was given up");
              send(sse_event(e.body()));
              send(sse_done());
              sink.done();
              return true;
            }
            const std::string last = outcome->error ? outcome->error->body() : dump(answer(model, shape, *outcome));
            if (!send(sse_event(last)) || !send(sse_done())) return false;
            sink.done();
            return true;
          }
        });
  }

  ServiceOptions options_;
  Metrics metrics_;
  Scheduler scheduler_;
  std::vector<StaticFile> files_;
  std::map<std::string, std::set<std::string>> routes_;
  std::atomic<const TextModel*> model_{nullptr};
  std::time_t started_;
  std::atomic<std::uint64_t> completions_{0};
};

}  // namespace ldlm::server

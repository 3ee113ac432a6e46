// ldlm serve: the HTTP service (docs/server.md). It listens first, loads the model
// (GET /health answers 503 until it is ready), then answers until SIGTERM or SIGINT,
// when it stops accepting, finishes the requests it has (bounded by --timeout) and
// exits 0. The routes, the queue and the parsing are in server/.
#pragma once

#include <signal.h>
#include <sys/socket.h>

#include <csignal>
#include <ctime>
#include <filesystem>

#include "common.hpp"
#include "ldlm/text_model.hpp"
#include "server/routes.hpp"
#include "text.hpp"

namespace ldlm::cli {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::optional<std::string> api_key;
  int max_batch = 16, max_queue = 64;
  double batch_window_ms = 5;
  std::optional<int> max_length;
  double timeout = 60;
  std::int64_t max_body = 1 << 20;
  double io_timeout = 10;
  std::optional<int> http_threads;
};

const Command kServe{
    "serve",
    "answer completion, infill and generation requests over HTTP",
    "",
    "An HTTP service on the text API (docs/server.md): POST /v1/completions (OpenAI's\n"
    "completions), /infill, /generate, /tokenize, /detokenize; GET /v1/models, /health,\n"
    "/metrics and the playground page at /. Requests that arrive together with the same\n"
    "length and sampler settings run as one batch; \"stream\": true answers with Server-Sent\n"
    "Events, one per solver step. It prints 'listening on http://HOST:PORT' on stderr once\n"
    "bound (--port 0: a free port), then loads the model; SIGTERM or SIGINT drains and exits 0.",
    {text_option("host", "ADDR", &ServeOptions::host, "the address to listen on; 0.0.0.0 for every interface"),
     value_option("port", "P", &ServeOptions::port, {0, 65535}, "the TCP port; 0: any free one"),
     text_option("api-key", "KEY", &ServeOptions::api_key,
                 "require 'Authorization: Bearer KEY' on every endpoint but /health and the page"),
     value_option("max-batch", "N", &ServeOptions::max_batch, {1, 4096},
                  "sequences per batch, and samples (n) per request"),
     value_option("batch-window-ms", "MS", &ServeOptions::batch_window_ms, {0.0, 10000.0},
                  "after a batch, how long to wait for the requests known to be about\n(the batch's clients, "
                  "answered, and those waiting) before the next\none starts with fewer; 0: start at once"),
     value_option("max-queue", "Q", &ServeOptions::max_queue, {1, 1 << 16},
                  "sampling requests waiting; more are answered 429"),
     value_option("max-length", "T", &ServeOptions::max_length, {1, 1 << 20},
                  "token positions per sequence (prompt and suffix included);\ndefault: the model's max_positions"),
     value_option("timeout", "S", &ServeOptions::timeout, {0.0, 86400.0, true},
                  "seconds from a request's arrival to its answer (else 504);\nalso bounds the drain at shutdown"),
     value_option("max-body", "BYTES", &ServeOptions::max_body, {1, std::int64_t{1} << 30},
                  "the largest request body; larger is answered 413"),
     value_option("io-timeout", "S", &ServeOptions::io_timeout, {0.0, 3600.0, true},
                  "seconds a client may take to send a request or to take an answer,\nand a kept-alive connection may "
                  "stay idle"),
     value_option("http-threads", "N", &ServeOptions::http_threads, {1, 4096},
                  "connections served at once; default: --max-queue + --max-batch + 8"),
     kWeightsOption, kConfigOption, kTokenizerOption, kPrecisionOption, kThreadsOption},
    "The model: without options, the built-in demo model with GPT-2's tokenizer;\n"
    "--weights W serves the model of a file (--config C for a file without its\n"
    "configuration, --tokenizer DIR for other tokenizer files). docs/server.md describes the\n"
    "endpoints, the batching, the limits and running several instances.\n"};

/// Requests on one kept-alive connection before the server closes it (as nginx's
/// keepalive_requests).
inline constexpr std::size_t kKeepAliveRequests = 1000;

namespace detail {

template <class Table>
std::vector<std::string> names_of(const Table& table) {
  std::vector<std::string> out;
  for (const auto& entry : table) out.emplace_back(entry.name);
  return out;
}

/// The model of the model options: the built-in demo model unless --weights is given.
TextModel open_text_model(const ModelOptions& model, const TokenizerOptions& tokenizer) {
  TextModelOptions options;
  options.precision = model.precision == Precision::bf16 ? "bf16" : "fp32";
  if (!model.weights) return TextModel::demo(options);
  options.config = model.config.value_or("");
  return TextModel::open(*model.weights, tokenizer.dir.value_or(""), options);
}

}  // namespace detail

int run_serve(const Args& args) {
  args.expect_positionals(0, 0);
  const ServeOptions o = args.read<ServeOptions>();
  const ModelOptions model_options = args.read<ModelOptions>();
  const TokenizerOptions tokenizer_options = args.read<TokenizerOptions>();
  if (!model_options.weights && model_options.config)
    args.fail("--config needs --weights (the demo model has its own)");
  if (!model_options.weights && tokenizer_options.dir)
    args.fail("--tokenizer needs --weights (the demo model uses GPT-2's)");

  server::ServiceOptions service;
  service.model_name =
      model_options.weights ? std::filesystem::path(*model_options.weights).stem().string() : "ldlm-demo";
  service.api_key = o.api_key.value_or("");
  service.max_batch = o.max_batch;
  service.max_queue = o.max_queue;
  service.batch_window =
      std::chrono::duration_cast<server::Clock::duration>(std::chrono::duration<double, std::milli>(o.batch_window_ms));
  service.timeout = o.timeout;
  service.threads = model_options.threads.value_or(0);
  service.limits.max_batch = o.max_batch;
  service.limits.samplers = detail::names_of(kSamplers);
  service.limits.schedules = detail::names_of(kTimeGrids);
  service.limits.methods = detail::names_of(kConditionMethods);
  service.limits.precisions = detail::names_of(kPrecisions);

  // Signals go to the thread that waits for them, not to httplib's threads: blocked
  // here, before any thread starts, and inherited by every thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // A client gone mid-answer is a failed write, not a signal that ends the process.
  std::signal(SIGPIPE, SIG_IGN);

  // The model's positions bound --max-length; they are known once it is loaded, so the
  // limit is set then (the routes answer 503 before).
  server::Service svc(service);
  httplib::Server http;
  const int http_threads = o.http_threads.value_or(o.max_queue + o.max_batch + 8);
  http.new_task_queue = [http_threads] { return new httplib::ThreadPool(static_cast<std::size_t>(http_threads)); };
  http.set_payload_max_length(static_cast<std::size_t>(o.max_body));
  // httplib writes an answer's header and body in two writes: with Nagle's algorithm on,
  // the body waits for the client's delayed ACK of the header, about 40 ms on Linux, which
  // was most of a request's latency and kept a batch's clients from coming back together.
  http.set_tcp_nodelay(true);
  // httplib closes a kept-alive connection after 5 requests by default: every client then
  // reconnects every 5 requests, and the listen backlog httplib 0.11 compiles in (5) drops
  // the SYNs of a burst of reconnections, each then retried after a second.
  http.set_keep_alive_max_count(kKeepAliveRequests);
  const auto io = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(o.io_timeout));
  http.set_read_timeout(io);
  http.set_write_timeout(io);
  http.set_keep_alive_timeout(std::max<time_t>(1, static_cast<time_t>(o.io_timeout)));

  // httplib 0.11 listens with a backlog of 5, compiled into Debian's library: a burst of
  // new connections (16 clients starting) overflows it, and the kernel drops their
  // handshakes (retried after a second) or resets them. A second listen() on the socket
  // sets a larger backlog; the socket is known from the options callback, which sees it
  // before bind.
  int listening_socket = -1;
  http.set_socket_options([&listening_socket](socket_t sock) {
    httplib::default_socket_options(sock);
    listening_socket = static_cast<int>(sock);
  });
  int port = o.port;
  if (port == 0) {
    port = http.bind_to_any_port(o.host);
    if (port < 0) throw Error("serve: cannot listen on " + o.host + " (any port)");
  } else if (!http.bind_to_port(o.host, port)) {
    throw Error("serve: cannot listen on " + o.host + ":" + std::to_string(port) + " (in use, or not an address here)");
  }
  if (::listen(listening_socket, SOMAXCONN) != 0)
    throw Error("serve: cannot set the listen backlog of " + o.host + ":" + std::to_string(port));
  const std::string url_host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  std::fprintf(stderr, "ldlm serve: listening on http://%s:%d\n", url_host.c_str(), port);
  std::fflush(stderr);

  svc.install(http);
  // `stopping` is set by a signal, or by a failed load; the listener then stops. httplib's
  // stop() does nothing before the listener has started running, so it is repeated until
  // the listener has returned.
  std::atomic<bool> stopping{false}, listener_done{false};
  std::thread signals([&] {
    const timespec poll{0, 100'000'000};
    while (!stopping) {
      siginfo_t info;
      const int sig = sigtimedwait(&stop_signals, &info, &poll);
      if (sig == SIGTERM || sig == SIGINT) {
        std::fprintf(stderr, "ldlm serve: %s: no new connections; finishing the requests in progress\n",
                     sig == SIGTERM ? "SIGTERM" : "SIGINT");
        stopping = true;
      }
    }
    while (!listener_done) {
      http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::thread listener([&] {
    if (!http.listen_after_bind() && !stopping) std::fprintf(stderr, "ldlm serve: the listening socket failed\n");
    listener_done = true;
    stopping = true;
  });

  std::optional<TextModel> model;
  std::string load_error;
  try {
    model.emplace(detail::open_text_model(model_options, tokenizer_options));
    const int max_positions = model->info().max_positions;
    if (o.max_length && *o.max_length > max_positions)
      throw InvalidArgument("--max-length " + std::to_string(*o.max_length) +
                            " is more than the model's max_positions " + std::to_string(max_positions));
  } catch (const std::exception& e) {
    model.reset();
    load_error = e.what();
  }
  if (model) {
    const TextModelInfo info = model->info();
    svc.set_max_length(o.max_length.value_or(info.max_positions));
    svc.ready(*model);
    std::fprintf(stderr, "ldlm serve: model %s ready (%.0f ms)\n", service.model_name.c_str(), info.load_ms);
    std::fflush(stderr);
  } else {
    std::fprintf(stderr, "ldlm serve: error: %s\n", load_error.c_str());
    stopping = true;
  }
  listener.join();
  signals.join();
  svc.stop();
  if (!model) return 1;
  std::fprintf(stderr, "ldlm serve: stopped\n");
  return 0;
}

}  // namespace ldlm::cli

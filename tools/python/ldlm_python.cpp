// ldlm._ldlm: the compiled half of the `ldlm` Python package (docs/python.md). One
// translation unit over ldlm::text (TextModel) and the header-only layers (the modules
// of load_model, the tokenizer, the configuration and its parameter table).
//
// Arrays: a module reads its float32 [B, T, d] inputs in place (the numpy buffer is
// mapped as the row-major matrix the module takes) and returns its output without a
// copy (the array's base is a capsule that owns the C++ tensor). Anything else (another
// dtype, non-C-contiguous strides, a wrong shape) is an ldlm.ShapeError or
// ldlm.InvalidArgument naming the module, the argument, what was expected and found.
//
// Threads: the GIL is released around every computation and taken back for the
// callbacks (on_step) and for the per-step interrupt check, which turns Ctrl-C into a
// KeyboardInterrupt at the next sampling step.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "ldlm/text_model.hpp"
#include "ldlm_embedded.hpp"

namespace py = pybind11;

namespace ldlm::python {
namespace {

// ----------------------------------------------------------------------------- arrays

std::string dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

Shape array_shape(const py::array& a) { return Shape(a.shape(), a.shape() + a.ndim()); }

std::string strides_string(const py::array& a) { return shape_string(Shape(a.strides(), a.strides() + a.ndim())); }

/// The numpy array `object`, which must be C-contiguous with elements of type T; else an
/// InvalidArgument naming `where`, `argument`, the expected and the found.
template <class T>
py::array expect_array(const std::string& where, const char* argument, const py::object& object,
                       const char* expected_dtype) {
  if (!py::isinstance<py::array>(object))
    throw InvalidArgument(where + ": argument '" + argument + "' must be a numpy.ndarray of " + expected_dtype +
                          ", got " + py::str(py::type::of(object).attr("__name__")).cast<std::string>());
  py::array a = py::reinterpret_borrow<py::array>(object);
  if (!a.dtype().is(py::dtype::of<T>()) && !a.dtype().equal(py::dtype::of<T>()))
    throw InvalidArgument(where + ": argument '" + argument + "' must have dtype " + expected_dtype + ", got " +
                          dtype_name(a) + " (shape " + shape_string(array_shape(a)) +
                          "); convert it with .astype(numpy." + expected_dtype + ")");
  if (!(a.flags() & py::array::c_style))
    throw InvalidArgument(where + ": argument '" + argument + "' must be C-contiguous, got strides " +
                          strides_string(a) + " (bytes) for shape " + shape_string(array_shape(a)) +
                          "; pass numpy.ascontiguousarray(" + argument + ")");
  return a;
}

/// A C-contiguous float32 [B, T, d] activation with 1 <= T <= max_positions and B >= 1.
py::array expect_activation(const std::string& where, const char* argument, const py::object& object, const Config& c) {
  py::array a = expect_array<float>(where, argument, object, "float32");
  const Shape shape = array_shape(a);
  check_shape(where, argument, {-1, -1, c.d_model}, shape);
  if (shape[0] < 1 || shape[1] < 1 || shape[1] > c.max_positions)
    throw ShapeError(where + ": tensor '" + argument + "' has shape " + shape_string(shape) +
                     "; need B >= 1 and 1 <= T <= max_positions = " + std::to_string(c.max_positions));
  check_batch_fits(where, shape[0], shape[1], c);
  return a;
}

ConstMatrixMap<float> rows_of(const py::array& a) {
  const Index cols = a.shape(a.ndim() - 1);
  return ConstMatrixMap<float>(static_cast<const float*>(a.data()), a.size() / cols, cols);
}

/// The addresses a module call handed to the kernels, by argument: what
/// Model._last_input_addresses shows the zero-copy tests.
using InputAddresses = std::vector<std::pair<std::string, std::uintptr_t>>;

std::uintptr_t address_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

/// A [B, T, width] float32 output that numpy will own: an aligned buffer written by the
/// module, handed to an array whose base is the capsule that frees it. The capsule's
/// pointer is the buffer itself, so a test can see that the array's memory is this one.
class Output {
 public:
  Output(Index B, Index T, Index width)
      : B_(B),
        T_(T),
        width_(width),
        data_(static_cast<float*>(
            Eigen::internal::aligned_malloc(static_cast<std::size_t>(B * T * width) * sizeof(float)))) {}
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  ~Output() { Eigen::internal::aligned_free(data_); }

  MatrixMap<float> rows() { return MatrixMap<float>(data_, B_ * T_, width_); }

  py::array_t<float> release() && {
    py::capsule owner(data_, [](void* p) { Eigen::internal::aligned_free(p); });
    float* data = std::exchange(data_, nullptr);
    const auto f = static_cast<py::ssize_t>(sizeof(float));
    return py::array_t<float>({B_, T_, width_}, {T_ * width_ * f, width_ * f, f}, data, owner);
  }

 private:
  Index B_, T_, width_;
  float* data_;
};

/// Python strings of texts that may end inside a character (a sample's last token can
/// hold part of one): such bytes become U+FFFD instead of a UnicodeDecodeError.
py::str text_of(const std::string& bytes) {
  PyObject* text = PyUnicode_DecodeUTF8(bytes.data(), static_cast<py::ssize_t>(bytes.size()), "replace");
  if (!text) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

py::list texts_of(std::span<const std::string> texts) {
  py::list list;
  for (const std::string& t : texts) list.append(text_of(t));
  return list;
}

py::array_t<std::int64_t> ids_array(const std::vector<TokenIds>& samples, const char* where) {
  const std::size_t T = samples.empty() ? 0 : samples.front().size();
  for (const TokenIds& s : samples)
    if (s.size() != T)
      throw Error(std::string(where) + ": samples of different lengths (" + std::to_string(T) + " and " +
                  std::to_string(s.size()) + " tokens) cannot form one array");
  py::array_t<std::int64_t> out({static_cast<py::ssize_t>(samples.size()), static_cast<py::ssize_t>(T)});
  std::int64_t* data = out.mutable_data();
  for (std::size_t b = 0; b < samples.size(); ++b)
    std::memcpy(data + b * T, samples[b].data(), T * sizeof(std::int64_t));
  return out;
}

// --------------------------------------------------------------------- configuration

py::object json_module() { return py::module_::import("json"); }

/// A Config from an ldlm.Config, a dict of docs/model.md §Configuration's keys, or the
/// path of a JSON configuration file.
Config to_config(const py::handle& value, const char* where) {
  if (py::isinstance<Config>(value)) return value.cast<Config>();
  if (py::isinstance<py::dict>(value))
    return Config::parse(json_module().attr("dumps")(value).cast<std::string>(), "(dict)");
  if (py::isinstance<py::str>(value)) return Config::load(value.cast<std::string>());
  throw InvalidArgument(std::string(where) + ": argument 'config' must be an ldlm.Config, a dict or a path, got " +
                        py::str(py::type::of(value).attr("__name__")).cast<std::string>());
}

py::dict config_dict(const Config& c) { return json_module().attr("loads")(c.to_json().dump()); }

// ------------------------------------------------------------------------ the model

int thread_count(int threads, const std::string& where) {
  if (threads < 0 || threads > 1024)
    throw InvalidArgument(where + ": threads must be in [0, 1024], got " + std::to_string(threads));
  return threads ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// What ldlm.load_model returns: the whole LDLM, packed for one precision.
struct LoadedModel {
  Model model;
  Precision precision;
  std::string path;
  std::vector<std::string> loaded;  // module names, of module_names()
  mutable ContextPool contexts;
  mutable std::mutex last_inputs_mutex;
  mutable InputAddresses last_inputs;

  LoadedModel(Model m, Precision p, std::string file, std::vector<std::string> modules)
      : model(std::move(m)), precision(p), path(std::move(file)), loaded(std::move(modules)) {}

  void record_inputs(InputAddresses inputs) const {
    const std::lock_guard lock(last_inputs_mutex);
    last_inputs = std::move(inputs);
  }
};

/// One module of a LoadedModel, callable on numpy arrays (docs/model.md §Module inputs
/// and outputs; shapes in PyTorch order).
struct ModuleHandle {
  std::shared_ptr<const LoadedModel> owner;
  std::string name;

  std::string where() const { return "ldlm." + name; }
  const Config& config() const { return owner->model.config; }

  /// Runs f(ctx) on a leased context with the GIL released.
  template <class F>
  void run(int threads, InputAddresses inputs, F&& f) const {
    const int n = thread_count(threads, where());
    owner->record_inputs(std::move(inputs));
    py::gil_scoped_release release;
    auto ctx = owner->contexts.take(n);
    f(*ctx);
  }

  py::array_t<float> features(const py::object& ids_object, int threads) const {
    const Config& c = config();
    py::array ids = expect_array<std::int64_t>(where(), "ids", ids_object, "int64");
    const Shape shape = array_shape(ids);
    check_shape(where(), "ids", {-1, -1}, shape);
    const Index B = shape[0], T = shape[1];
    if (B < 1 || T < 1 || T > c.max_positions)
      throw ShapeError(where() + ": tensor 'ids' has shape " + shape_string(shape) +
                       "; need B >= 1 and 1 <= T <= max_positions = " + std::to_string(c.max_positions));
    check_batch_fits(where(), B, T, c);
    const auto* tokens = static_cast<const std::int64_t*>(ids.data());
    for (Index i = 0; i < B * T; ++i)
      if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
        throw InvalidArgument(where() + ": tensor 'ids' has id " + std::to_string(tokens[i]) + " at [" +
                              std::to_string(i / T) + ", " + std::to_string(i % T) + "], outside the vocabulary [0, " +
                              std::to_string(c.vocab_size) + ")");
    Output out(B, T, c.d_model);
    run(threads, {{"ids", address_of(tokens)}},
        [&](Context& ctx) { owner->model.feature_model.forward(ctx, tokens, B, T, out.rows()); });
    return std::move(out).release();
  }

  /// encoder, latent_decoder, token_decoder: one [B, T, d] activation in, one out.
  template <class Module>
  py::array_t<float> one_input(const Module& module, const char* argument, Index out_width, const py::object& object,
                               int threads) const {
    py::array x = expect_activation(where(), argument, object, config());
    const Index B = x.shape(0), T = x.shape(1);
    Output out(B, T, out_width);
    const ConstMatrixMap<float> rows = rows_of(x);
    run(threads, {{argument, address_of(rows.data())}},
        [&](Context& ctx) { module.forward(ctx, rows, B, T, out.rows()); });
    return std::move(out).release();
  }

  py::array_t<float> denoise(const py::object& x_t_object, const py::object& t_object,
                             const py::object& self_cond_object, int threads) const {
    const Config& c = config();
    py::array x_t = expect_activation(where(), "x_t", x_t_object, c);
    const Index B = x_t.shape(0), T = x_t.shape(1), d = c.d_model;
    py::array t = expect_array<float>(where(), "t", t_object, "float32");
    check_shape(where(), "t", {B}, array_shape(t));
    const auto* times = static_cast<const float*>(t.data());
    for (Index b = 0; b < B; ++b)
      if (!std::isfinite(times[b]))
        throw InvalidArgument(where() + ": tensor 't' has a non-finite value at index " + std::to_string(b));
    // self_cond None is the zero estimate (docs/model.md §Denoiser), as in the reference.
    std::optional<Matrix<float>> zeros;
    py::array self_cond;
    if (self_cond_object.is_none()) {
      zeros.emplace(Matrix<float>::Zero(B * T, d));
    } else {
      self_cond = expect_array<float>(where(), "self_cond", self_cond_object, "float32");
      check_shape(where(), "self_cond", {B, T, d}, array_shape(self_cond));
    }
    Output out(B, T, d);
    const ConstMatrixMap<float> x_rows = rows_of(x_t);
    const ConstMatrixMap<float> cond = zeros ? ConstMatrixMap<float>(zeros->data(), B * T, d) : rows_of(self_cond);
    run(threads, {{"x_t", address_of(x_rows.data())}, {"t", address_of(times)}, {"self_cond", address_of(cond.data())}},
        [&](Context& ctx) {
          Arena::Scope scope(ctx.arena());
          const auto rotary = make_rotary_table<float>(ctx.arena(), T, c.head_dim, c.rope_base);
          owner->model.denoiser.forward(ctx, x_rows, times, cond, B, T, rotary, out.rows());
        });
    return std::move(out).release();
  }
};

/// The whole model (every parameter present, nothing left over), or only `modules`
/// from a file that may hold just those (a denoiser of one's own, say).
std::shared_ptr<const LoadedModel> load(const std::string& path, const py::object& config, const std::string& precision,
                                        const std::optional<std::vector<std::string>>& modules) {
  std::optional<Config> given;
  if (!config.is_none()) given = to_config(config, "ldlm.load_model");
  const Precision p = parse_precision(precision, "ldlm.load_model: precision");
  py::gil_scoped_release release;
  const SafetensorsFile file = SafetensorsFile::open(path);
  if (!modules) {
    ModelLoadOptions options;
    options.config = given;
    options.pack = p;
    return std::make_shared<const LoadedModel>(load_model<float>(file, options), p, path, module_names());
  }
  Model model(resolve_config(file, given));
  for (const std::string& name : *modules) load_module(model, file, name, p);
  return std::make_shared<const LoadedModel>(std::move(model), p, path, *modules);
}

// --------------------------------------------------------------------- the tokenizer

Tokenizer gpt2_tokenizer() {
  const auto vocab = embedded::find("gpt2/encoder.json"), merges = embedded::find("gpt2/vocab.bpe");
  if (!vocab || !merges) throw Error("ldlm.Tokenizer: GPT-2's tokenizer files are missing from this build");
  return Tokenizer::from_vocab_and_merges(*vocab, *merges, "gpt2/encoder.json", "gpt2/vocab.bpe");
}

// ----------------------------------------------------------------------- TextModel

/// The keyword arguments every TextModel call takes (TextOptions; docs/python.md).
struct CallOptions {
  int length = 32, batch = 1;
  std::uint64_t seed = 0;
  std::optional<std::string> suffix, sampler;
  int steps = 0;
  std::optional<std::string> schedule, precision;
  int threads = 0;
  std::optional<std::string> method;
  int resample = 0;
  py::object on_step = py::none();
};

#define LDLM_PY_CALL_ARGS                                                                                           \
  py::kw_only(), py::arg("length") = 32, py::arg("batch") = 1, py::arg("seed") = 0, py::arg("suffix") = py::none(), \
                 py::arg("sampler") = py::none(), py::arg("steps") = 0, py::arg("schedule") = py::none(),           \
                 py::arg("precision") = py::none(), py::arg("threads") = 0, py::arg("method") = py::none(),         \
                 py::arg("resample") = 0, py::arg("on_step") = py::none()

/// Runs `call(options)` with the GIL released, with on_step and the interrupt check
/// wired to Python. A Python exception raised inside (by on_step, or KeyboardInterrupt
/// from a signal) ends the sampling at that step and is re-raised as is.
template <class R, class Call>
R with_text_options(const CallOptions& o, Call&& call) {
  TextOptions options;
  options.length = o.length;
  options.batch = o.batch;
  options.seed = o.seed;
  options.suffix = o.suffix.value_or("");
  options.sampler = o.sampler.value_or("");
  options.steps = o.steps;
  options.schedule = o.schedule.value_or("");
  options.precision = o.precision.value_or("");
  options.threads = o.threads;
  options.method = o.method.value_or("");
  options.resample = o.resample;

  std::optional<py::error_already_set> raised;  // set with the GIL held
  if (!o.on_step.is_none()) {
    // By address: the std::function may be copied without the GIL, a py::object may not.
    const py::object* on_step = &o.on_step;
    options.on_step = [&raised, on_step](const TextStep& step) {
      py::gil_scoped_acquire gil;
      try {
        py::dict view;
        view["step"] = step.step;
        view["steps"] = step.steps;
        view["denoiser_calls"] = step.denoiser_calls;
        view["total_calls"] = step.total_calls;
        view["t"] = step.t;
        view["texts"] = texts_of(step.texts);
        view["ids"] = ids_array(std::vector<TokenIds>(step.ids.begin(), step.ids.end()), "on_step");
        const py::object result = (*on_step)(view);
        return !(py::isinstance<py::bool_>(result) && !result.cast<bool>());
      } catch (py::error_already_set& e) {
        raised.emplace(std::move(e));
        return false;
      }
    };
  }
  // Asked after every step: the pending signal handlers run here (on the main thread
  // only, as Python runs them), so Ctrl-C stops the sampling at the next step.
  options.cancel = [&raised] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    raised.emplace();  // fetches the handler's exception (KeyboardInterrupt)
    return true;
  };

  try {
    py::gil_scoped_release release;
    return call(options);
  } catch (const SamplingCancelled&) {
    if (raised) throw std::move(*raised);
    throw;
  }
}

struct PyTextModel {
  std::shared_ptr<const TextModel> model;

  py::list generate(const CallOptions& o) const {
    return texts_of(
        with_text_options<std::vector<std::string>>(o, [&](const TextOptions& t) { return model->generate(t); }));
  }
  py::list continue_text(const std::string& prompt, const CallOptions& o) const {
    return texts_of(with_text_options<std::vector<std::string>>(
        o, [&](const TextOptions& t) { return model->continue_text(prompt, t); }));
  }
  py::list infill(const std::string& text, const CallOptions& o) const {
    return texts_of(
        with_text_options<std::vector<std::string>>(o, [&](const TextOptions& t) { return model->infill(text, t); }));
  }
  py::array_t<std::int64_t> generate_ids(const CallOptions& o) const {
    return ids_array(
        with_text_options<std::vector<TokenIds>>(o, [&](const TextOptions& t) { return model->generate_ids(t); }),
        "ldlm.TextModel.generate_ids");
  }
  py::array_t<std::int64_t> continue_ids(const std::vector<std::int64_t>& prompt, const CallOptions& o) const {
    return ids_array(with_text_options<std::vector<TokenIds>>(
                         o, [&](const TextOptions& t) { return model->continue_ids(prompt, t); }),
                     "ldlm.TextModel.continue_ids");
  }
  py::array_t<std::int64_t> infill_ids(const std::vector<std::int64_t>& ids, const CallOptions& o) const {
    return ids_array(
        with_text_options<std::vector<TokenIds>>(o, [&](const TextOptions& t) { return model->infill_ids(ids, t); }),
        "ldlm.TextModel.infill_ids");
  }
};

CallOptions call_options(int length, int batch, std::uint64_t seed, std::optional<std::string> suffix,
                         std::optional<std::string> sampler, int steps, std::optional<std::string> schedule,
                         std::optional<std::string> precision, int threads, std::optional<std::string> method,
                         int resample, py::object on_step) {
  if (!on_step.is_none() && !PyCallable_Check(on_step.ptr()))
    throw InvalidArgument("ldlm.TextModel: on_step must be callable or None, got " +
                          py::str(py::type::of(on_step).attr("__name__")).cast<std::string>());
  return {length,
          batch,
          seed,
          std::move(suffix),
          std::move(sampler),
          steps,
          std::move(schedule),
          std::move(precision),
          threads,
          std::move(method),
          resample,
          std::move(on_step)};
}

// ---------------------------------------------------------------------------- errors

/// ldlm.Error and its subclasses, one per class of core/error.hpp, each carrying the
/// C++ message. pybind11 tries the translators newest first, so a base is registered
/// before its subclasses.
void register_errors(py::module_& m) {
  auto& base = py::register_exception<Error>(m, "Error", PyExc_Exception);
  py::register_exception<ShapeError>(m, "ShapeError", base);
  py::register_exception<InvalidArgument>(m, "InvalidArgument", base);
  auto& io = py::register_exception<IoError>(m, "IoError", base);
  py::register_exception<FormatError>(m, "FormatError", io);
  py::register_exception<CheckpointError>(m, "CheckpointError", base);
  py::register_exception<ConfigError>(m, "ConfigError", base);
  py::register_exception<NumericError>(m, "NumericError", base);
  py::register_exception<SamplingCancelled>(m, "SamplingCancelled", base);
}

}  // namespace
}  // namespace ldlm::python

PYBIND11_MODULE(_ldlm, m) {
  using namespace ldlm;
  using namespace ldlm::python;
  m.doc() = "ldlm's compiled module; import ldlm instead (docs/python.md)";
  m.attr("__version__") = LDLM_VERSION;
  register_errors(m);

  // Config ---------------------------------------------------------------------------
  py::class_<Config> config(m, "Config", "The model configuration (docs/model.md §Configuration).");
  config.def(py::init<>(), "ldlm-base's configuration.")
      .def_static(
          "from_dict", [](const py::dict& d) { return to_config(d, "ldlm.Config.from_dict"); }, py::arg("values"),
          "Keys of docs/model.md §Configuration; missing keys keep ldlm-base's values.")
      .def_static("load", &Config::load, py::arg("path"), "A JSON configuration file.")
      .def_static(
          "from_weights",
          [](const std::string& path) {
            const auto c = read_config(SafetensorsFile::open(path));
            if (!c) throw ConfigError("ldlm.Config.from_weights: '" + path + "' stores no configuration");
            return *c;
          },
          py::arg("path"), "The configuration a weights file stores in its metadata.")
      .def("to_dict", &config_dict)
      .def("to_json", [](const Config& c) { return c.to_json().dump(2); })
      .def("__eq__", [](const Config& a, const Config& b) { return a.to_json() == b.to_json(); })
      .def("__repr__", [](const Config& c) { return "ldlm.Config(" + c.to_json().dump() + ")"; })
      .def(py::pickle([](const Config& c) { return c.to_json().dump(); },
                      [](const std::string& text) { return Config::parse(text, "(pickle)"); }));
  const Config defaults;
  Config::visit_fields(defaults, [&](const char* key, const auto&) {
    const std::string name = key;
    config.def_property_readonly(key, [name](const Config& c) -> py::object { return config_dict(c)[name.c_str()]; });
  });

  m.def(
      "params",
      [](const py::object& c) {
        const LDLM<float> shapes_only(to_config(c, "ldlm.params"));  // allocates no parameter
        py::dict table;
        for (const auto& row : parameter_table(shapes_only))
          table[row.module.c_str()] =
              py::dict(py::arg("trained") = row.counts.trained, py::arg("frozen") = row.counts.frozen);
        const ParameterCounts total = count_parameters(shapes_only);
        table["total"] = py::dict(py::arg("trained") = total.trained, py::arg("frozen") = total.frozen);
        table["denoiser_final_layernorm"] = count_parameters(shapes_only.denoiser.output_layer.norm_final).total();
        return table;
      },
      py::arg("config"),
      "The parameter table of `ldlm params`: {module: {trained, frozen}}, 'total', and the denoiser's final "
      "LayerNorm (docs/model.md §Parameter accounting).");

  // Tokenizer ------------------------------------------------------------------------
  py::class_<Tokenizer>(m, "Tokenizer", "GPT-2's byte-level BPE with pad and mask after its tokens.")
      .def(py::init([](const std::optional<std::string>& directory) {
             return directory ? Tokenizer::load(*directory) : gpt2_tokenizer();
           }),
           py::arg("directory") = py::none(),
           "The tokenizer files of a directory (encoder.json + vocab.bpe, vocab.json + merges.txt, or "
           "tokenizer.json); None: GPT-2's, built in.")
      .def(
          "encode",
          [](const Tokenizer& t, std::string_view text) {
            py::gil_scoped_release release;
            return t.encode(text);
          },
          py::arg("text"))
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<std::int64_t>& ids) {
            std::string bytes;
            {
              py::gil_scoped_release release;
              bytes = t.decode(ids);
            }
            return text_of(bytes);
          },
          py::arg("ids"), "Text; bytes that are not UTF-8 (a character cut between tokens) become U+FFFD.")
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("pad_id", &Tokenizer::pad_id)
      .def_property_readonly("mask_id", &Tokenizer::mask_id);

  // load_model and its modules -----------------------------------------------------------
  py::class_<ModuleHandle>(m, "Module", "One module of a loaded model, callable on numpy arrays.")
      .def_property_readonly("name", [](const ModuleHandle& h) { return h.name; })
      .def("__repr__", [](const ModuleHandle& h) { return "<ldlm." + h.name + " of '" + h.owner->path + "'>"; })
      .def(
          "__call__",
          [](const ModuleHandle& h, const py::args& args, const py::kwargs& kwargs) -> py::array_t<float> {
            // Each module's own signature, checked here so its message names the module.
            const auto arg = [&](std::size_t i, const char* name, bool optional) -> py::object {
              if (i < args.size()) return args[i];
              if (kwargs.contains(name)) return kwargs[name];
              if (optional) return py::none();
              throw InvalidArgument(h.where() + ": missing argument '" + name + "'");
            };
            const auto& loaded = h.owner->loaded;
            if (std::find(loaded.begin(), loaded.end(), h.name) == loaded.end())
              throw InvalidArgument(h.where() + ": this module was not loaded (load_model's modules= left it out)");
            int threads = 0;
            if (kwargs.contains("threads")) {
              const py::object value = kwargs["threads"];
              if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value))
                throw InvalidArgument(h.where() + ": threads must be an int, got " +
                                      py::str(py::type::of(value).attr("__name__")).cast<std::string>());
              threads = value.cast<int>();
            }
            const Model& model = h.owner->model;
            std::size_t count = 1;
            if (h.name == "denoiser") count = 3;
            std::vector<std::string> allowed{"threads"};
            if (h.name == "feature_model") allowed.push_back("ids");
            if (h.name == "encoder") allowed.push_back("features");
            if (h.name == "latent_decoder") allowed.push_back("z");
            if (h.name == "token_decoder") allowed.push_back("h");
            if (h.name == "denoiser") allowed.insert(allowed.end(), {"x_t", "t", "self_cond"});
            if (args.size() > count)
              throw InvalidArgument(h.where() + ": takes " + std::to_string(count) + " array argument(s), got " +
                                    std::to_string(args.size()));
            for (const auto& [key, value] : kwargs)
              if (std::find(allowed.begin(), allowed.end(), key.cast<std::string>()) == allowed.end())
                throw InvalidArgument(h.where() + ": unexpected keyword argument '" + key.cast<std::string>() + "'");
            const Index d = model.config.d_model;
            if (h.name == "feature_model") return h.features(arg(0, "ids", false), threads);
            if (h.name == "encoder")
              return h.one_input(model.encoder, "features", d, arg(0, "features", false), threads);
            if (h.name == "latent_decoder")
              return h.one_input(model.latent_decoder, "z", d, arg(0, "z", false), threads);
            if (h.name == "token_decoder")
              return h.one_input(model.token_decoder, "h", model.config.vocab_size, arg(0, "h", false), threads);
            return h.denoise(arg(0, "x_t", false), arg(1, "t", false), arg(2, "self_cond", true), threads);
          },
          "feature_model(ids int64 [B,T]) -> features; encoder(features) -> latents; latent_decoder(z) -> hidden; "
          "token_decoder(h) -> logits [B,T,V]; denoiser(x_t, t float32 [B], self_cond=None) -> x0. Activations are "
          "C-contiguous float32 [B, T, d]; threads=0 (every core) is a keyword of each.");

  py::class_<LoadedModel, std::shared_ptr<LoadedModel>> model(m, "Model",
                                                              "A whole LDLM from a weights file (ldlm.load_model).");
  model.def_property_readonly("config", [](const LoadedModel& l) { return l.model.config; })
      .def_property_readonly("precision",
                             [](const LoadedModel& l) { return std::string(precision_name(l.precision)); })
      .def_property_readonly("path", [](const LoadedModel& l) { return l.path; })
      .def_property_readonly("modules", [](const LoadedModel& l) { return l.loaded; })
      .def_property_readonly(
          "_last_input_addresses",
          [](const LoadedModel& l) {
            const std::lock_guard lock(l.last_inputs_mutex);
            py::dict d;
            for (const auto& [name, address] : l.last_inputs) d[name.c_str()] = address;
            return d;
          },
          "For the zero-copy tests: the address each input of the last module call was read from.")
      .def("__repr__", [](const LoadedModel& l) { return "<ldlm.Model '" + l.path + "'>"; });
  for (const std::string& name : module_names())
    model.def_property_readonly(name.c_str(), [name](std::shared_ptr<LoadedModel> l) {
      return ModuleHandle{std::move(l), name};
    });
  m.def(
      "load_model",
      [](const std::string& path, const py::object& config, const std::string& precision,
         const std::optional<std::vector<std::string>>& modules) {
        return std::const_pointer_cast<LoadedModel>(load(path, config, precision, modules));
      },
      py::arg("path"), py::arg("config") = py::none(), py::arg("precision") = "fp32", py::kw_only(),
      py::arg("modules") = py::none(),
      "The model of a safetensors weights file (its configuration from the file's metadata, or `config`: an "
      "ldlm.Config, a dict or a JSON path), packed for `precision` ('fp32', 'bf16' or 'int8'). modules=None loads the "
      "whole model strictly; a list of names loads only those (the file may hold just them).");

  // TextModel -------------------------------------------------------------------------
  py::class_<PyTextModel>(m, "TextModel", "Text in, text out (include/ldlm/text_model.hpp).")
      .def_static(
          "demo",
          [](const std::string& precision) {
            TextModelOptions options;
            options.precision = precision;
            py::gil_scoped_release release;
            return PyTextModel{std::make_shared<const TextModel>(TextModel::demo(options))};
          },
          py::arg("precision") = "fp32", "The trained demo model that ships with ldlm, with GPT-2's tokenizer.")
      .def_static(
          "open",
          [](const std::string& weights, const std::optional<std::string>& tokenizer_dir, const std::string& precision,
             const std::optional<std::string>& config) {
            TextModelOptions options;
            options.precision = precision;
            options.config = config.value_or("");
            py::gil_scoped_release release;
            return PyTextModel{
                std::make_shared<const TextModel>(TextModel::open(weights, tokenizer_dir.value_or(""), options))};
          },
          py::arg("weights"), py::arg("tokenizer_dir") = py::none(), py::arg("precision") = "fp32",
          py::arg("config") = py::none(),
          "The model of a weights file and the tokenizer files of tokenizer_dir (None: GPT-2's); config: the path "
          "of a JSON configuration, for a file without one.")
      .def(
          "generate",
          [](const PyTextModel& t, int length, int batch, std::uint64_t seed, std::optional<std::string> suffix,
             std::optional<std::string> sampler, int steps, std::optional<std::string> schedule,
             std::optional<std::string> precision, int threads, std::optional<std::string> method, int resample,
             py::object on_step) {
            return t.generate(call_options(length, batch, seed, std::move(suffix), std::move(sampler), steps,
                                           std::move(schedule), std::move(precision), threads, std::move(method),
                                           resample, std::move(on_step)));
          },
          LDLM_PY_CALL_ARGS, "`batch` texts of `length` sampled tokens.")
      .def(
          "continue_text",
          [](const PyTextModel& t, const std::string& prompt, int length, int batch, std::uint64_t seed,
             std::optional<std::string> suffix, std::optional<std::string> sampler, int steps,
             std::optional<std::string> schedule, std::optional<std::string> precision, int threads,
             std::optional<std::string> method, int resample, py::object on_step) {
            return t.continue_text(prompt, call_options(length, batch, seed, std::move(suffix), std::move(sampler),
                                                        steps, std::move(schedule), std::move(precision), threads,
                                                        std::move(method), resample, std::move(on_step)));
          },
          py::arg("prompt"), LDLM_PY_CALL_ARGS, "`prompt`, then `length` sampled tokens (then `suffix`).")
      .def(
          "infill",
          [](const PyTextModel& t, const std::string& text, int length, int batch, std::uint64_t seed,
             std::optional<std::string> suffix, std::optional<std::string> sampler, int steps,
             std::optional<std::string> schedule, std::optional<std::string> precision, int threads,
             std::optional<std::string> method, int resample, py::object on_step) {
            return t.infill(text, call_options(length, batch, seed, std::move(suffix), std::move(sampler), steps,
                                               std::move(schedule), std::move(precision), threads, std::move(method),
                                               resample, std::move(on_step)));
          },
          py::arg("text"), LDLM_PY_CALL_ARGS, "`text` with each <|mask|> sampled.")
      .def(
          "generate_ids",
          [](const PyTextModel& t, int length, int batch, std::uint64_t seed, std::optional<std::string> suffix,
             std::optional<std::string> sampler, int steps, std::optional<std::string> schedule,
             std::optional<std::string> precision, int threads, std::optional<std::string> method, int resample,
             py::object on_step) {
            return t.generate_ids(call_options(length, batch, seed, std::move(suffix), std::move(sampler), steps,
                                               std::move(schedule), std::move(precision), threads, std::move(method),
                                               resample, std::move(on_step)));
          },
          LDLM_PY_CALL_ARGS, "generate, as int64 ids [batch, T].")
      .def(
          "continue_ids",
          [](const PyTextModel& t, const std::vector<std::int64_t>& prompt, int length, int batch, std::uint64_t seed,
             std::optional<std::string> suffix, std::optional<std::string> sampler, int steps,
             std::optional<std::string> schedule, std::optional<std::string> precision, int threads,
             std::optional<std::string> method, int resample, py::object on_step) {
            return t.continue_ids(prompt, call_options(length, batch, seed, std::move(suffix), std::move(sampler),
                                                       steps, std::move(schedule), std::move(precision), threads,
                                                       std::move(method), resample, std::move(on_step)));
          },
          py::arg("prompt"), LDLM_PY_CALL_ARGS, "continue_text on ids, as int64 ids [batch, T].")
      .def(
          "infill_ids",
          [](const PyTextModel& t, const std::vector<std::int64_t>& ids, int length, int batch, std::uint64_t seed,
             std::optional<std::string> suffix, std::optional<std::string> sampler, int steps,
             std::optional<std::string> schedule, std::optional<std::string> precision, int threads,
             std::optional<std::string> method, int resample, py::object on_step) {
            return t.infill_ids(ids, call_options(length, batch, seed, std::move(suffix), std::move(sampler), steps,
                                                  std::move(schedule), std::move(precision), threads, std::move(method),
                                                  resample, std::move(on_step)));
          },
          py::arg("ids"), LDLM_PY_CALL_ARGS, "infill on ids (mask_id where to fill), as int64 ids [batch, T].")
      .def(
          "tokenize",
          [](const PyTextModel& t, std::string_view text) {
            py::gil_scoped_release release;
            return t.model->tokenize(text);
          },
          py::arg("text"))
      .def(
          "detokenize",
          [](const PyTextModel& t, const std::vector<std::int64_t>& ids) {
            std::string bytes;
            {
              py::gil_scoped_release release;
              bytes = t.model->detokenize(ids);
            }
            return text_of(bytes);
          },
          py::arg("ids"))
      .def("info", [](const PyTextModel& t) {
        const TextModelInfo i = t.model->info();
        py::dict d;
        d["trained_parameters"] = i.trained_parameters;
        d["frozen_parameters"] = i.frozen_parameters;
        d["vocab_size"] = i.vocab_size;
        d["max_positions"] = i.max_positions;
        d["d_model"] = i.d_model;
        d["mask_id"] = i.mask_id;
        d["pad_id"] = i.pad_id;
        d["load_ms"] = i.load_ms;
        return d;
      });
}

// safetensors reader and writer (https://github.com/huggingface/safetensors).
//
// Layout: u64 little-endian header length N, N bytes of JSON header, data section.
// The reader holds the same line as the reference implementation: the whole
// header is validated against the file size before any tensor byte is touched,
// and the tensors must tile the data section exactly (no gaps, no overlaps, no
// trailing bytes). Files are memory-mapped read-only; tensor bytes are read with
// memcpy because a tensor may start at any offset.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ldlm/core/error.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/io/json.hpp"

namespace ldlm {

static_assert(std::endian::native == std::endian::little, "ldlm's safetensors I/O assumes a little-endian host");

// I16, I8, U8 and BOOL are read (checkpoints hold them: GPT-2's causal-mask buffer is
// BOOL in recent Hugging Face files) so that loaders can skip or convert them.
enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

inline constexpr std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::F64:
      return "F64";
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::I64:
      return "I64";
    case DType::I32:
      return "I32";
    case DType::I16:
      return "I16";
    case DType::I8:
      return "I8";
    case DType::U8:
      return "U8";
    case DType::BOOL:
      return "BOOL";
  }
  return "?";
}

inline constexpr std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64:
    case DType::I64:
      return 8;
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::F16:
    case DType::BF16:
    case DType::I16:
      return 2;
    case DType::I8:
    case DType::U8:
    case DType::BOOL:
      return 1;
  }
  return 0;
}

/// Integer-valued dtypes (BOOL reads as 0 and 1).
inline constexpr bool dtype_is_integer(DType d) {
  return d == DType::I64 || d == DType::I32 || d == DType::I16 || d == DType::I8 || d == DType::U8 || d == DType::BOOL;
}

namespace detail {
inline std::optional<DType> dtype_from_name(std::string_view s) {
  for (DType d : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I16, DType::I8,
                  DType::U8, DType::BOOL})
    if (dtype_name(d) == s) return d;
  return std::nullopt;
}
}  // namespace detail

/// "F32" -> DType::F32. Unknown names throw FormatError naming `tensor` (if given) and the string.
inline DType parse_dtype(std::string_view dtype, std::string_view tensor = {}) {
  if (auto d = detail::dtype_from_name(dtype)) return *d;
  std::string msg = "safetensors: unknown dtype '" + std::string(dtype) + "'";
  if (!tensor.empty()) msg += " for tensor '" + std::string(tensor) + "'";
  throw FormatError(msg);
}

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  std::uint64_t offset = 0, size = 0;  // relative to the data section
  std::int64_t numel() const { return static_cast<std::int64_t>(size / dtype_size(dtype)); }
};

namespace detail {

inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr std::size_t kMaxRank = 8;

/// Owns a read-only private mapping of a whole file.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, std::size_t len) : addr_(addr), len_(len) {}
  Mapping(Mapping&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      addr_ = std::exchange(o.addr_, nullptr);
      len_ = std::exchange(o.len_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }
  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(addr_), len_}; }
  /// Drops this process's pages of bytes [begin, begin + size) of the mapping, widened to
  /// whole pages (a page touched again is read from the file again: the mapping is
  /// private and never written).
  void drop_pages(std::size_t begin, std::size_t size) const {
    if (!addr_ || size == 0) return;
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<std::uintptr_t>(addr_) + begin;
    const std::uintptr_t first = start / page * page, last = (start + size + page - 1) / page * page;
    ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // advice: a failure changes nothing
  }

 private:
  void reset() {
    if (addr_) ::munmap(addr_, len_);
    addr_ = nullptr;
    len_ = 0;
  }
  void* addr_ = nullptr;
  std::size_t len_ = 0;
};

inline std::string errno_text() { return std::strerror(errno); }

}  // namespace detail

class SafetensorsFile {
 public:
  /// Memory-maps `path` read-only and validates it.
  static SafetensorsFile open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError("safetensors " + path + ": cannot open: " + detail::errno_text());
    struct stat st {};
    std::string err;
    void* addr = MAP_FAILED;
    if (::fstat(fd, &st) != 0)
      err = "cannot stat: " + detail::errno_text();
    else if (!S_ISREG(st.st_mode))
      err = "not a regular file";
    else if (st.st_size == 0)
      err = "empty file";
    else if ((addr = ::mmap(nullptr, std::size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED)
      err = "cannot mmap: " + detail::errno_text();
    ::close(fd);
    if (!err.empty()) throw IoError("safetensors " + path + ": " + err);
    SafetensorsFile f(path);
    f.mapping_ = detail::Mapping(addr, std::size_t(st.st_size));
    f.init(f.mapping_.bytes());
    return f;
  }

  /// Takes ownership of an in-memory file (tests, fuzzing); same validation as open().
  static SafetensorsFile from_buffer(std::vector<std::byte> buffer) {
    SafetensorsFile f("<buffer>");
    f.buffer_ = std::move(buffer);
    f.init(f.buffer_);
    return f;
  }

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile() = default;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  bool contains(std::string_view name) const { return find(name) != nullptr; }

  const TensorInfo& info(std::string_view name) const {
    if (const TensorInfo* t = find(name)) return *t;
    throw CheckpointError(where() + "no tensor '" + std::string(name) + "'");
  }

  /// The raw little-endian bytes of a tensor (not necessarily aligned).
  std::span<const std::byte> bytes(std::string_view name) const {
    const TensorInfo& t = info(name);
    return data_.subspan(t.offset, t.size);
  }

  /// Lets the memory of the bytes read so far go: a mapped file's pages are all dropped
  /// (read from the file again if touched again), so that loading does not keep the
  /// file resident beside the weights it filled; a file read into a buffer (from_buffer)
  /// keeps its bytes. All of them, not a tensor's range: reading a page also maps its
  /// cached neighbours (the kernel's fault-around, 64 KB), some in tensors read before,
  /// and those would stay. Cheap: the walk skips unmapped 2 MB ranges whole.
  void release_pages() const { mapping_.drop_pages(0, mapping_.bytes().size()); }

  /// Converts to T in {float, double, int64, int32}. Float dtypes cannot be read as integers;
  /// integer values that do not fit T throw FormatError.
  template <class T>
  std::vector<T> read(const std::string& name) const {
    const TensorInfo& t = info(name);
    std::vector<T> out(static_cast<std::size_t>(t.numel()));
    convert(t, 0, t.numel(), out.data());
    return out;
  }

  /// Like read(), into caller storage of exactly `count` elements.
  template <class T>
  void read_into(const std::string& name, T* dst, std::int64_t count) const {
    const TensorInfo& t = info(name);
    if (count != t.numel())
      throw CheckpointError(where() + "tensor '" + name + "' " + shape_string(t.shape) + " has " +
                            std::to_string(t.numel()) + " elements, but the destination holds " +
                            std::to_string(count));
    convert(t, 0, count, dst);
  }

  /// Elements [first, first + count) of tensor `name` (flat, row-major), converted as
  /// read() converts them, into dst: a large tensor read a block at a time (with
  /// release_pages) never has all of its bytes resident.
  template <class T>
  void read_elements_into(const std::string& name, std::int64_t first, std::int64_t count, T* dst) const {
    const TensorInfo& t = info(name);
    check_elements(t, first, count);
    convert(t, first, count, dst);
  }

 private:
  void check_elements(const TensorInfo& t, std::int64_t first, std::int64_t count) const {
    if (first < 0 || count < 0 || first > t.numel() - count)
      throw CheckpointError(where() + "tensor '" + t.name + "' " + shape_string(t.shape) + " has " +
                            std::to_string(t.numel()) + " elements, elements [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") were asked for");
  }

  explicit SafetensorsFile(std::string path) : path_(std::move(path)) {}

  std::string where() const { return "safetensors " + path_ + ": "; }
  [[noreturn]] void fail(const std::string& msg) const { throw FormatError(where() + msg); }

  const TensorInfo* find(std::string_view name) const {
    auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                               [](const TensorInfo& t, std::string_view n) { return t.name < n; });
    return it != tensors_.end() && it->name == name ? &*it : nullptr;
  }

  /// Elements [first, first + count) of t (checked by the caller) into dst.
  template <class T>
  void convert(const TensorInfo& t, std::int64_t first, std::int64_t count, T* dst) const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t> ||
                      std::is_same_v<T, std::int32_t>,
                  "SafetensorsFile::read supports float, double, int64_t and int32_t");
    const std::byte* src = data_.data() + t.offset + static_cast<std::size_t>(first) * dtype_size(t.dtype);
    const std::size_t n = static_cast<std::size_t>(count);
    auto each = [&](auto tag, auto&& f) {
      using S = decltype(tag);
      for (std::size_t i = 0; i < n; ++i) {
        S s;
        std::memcpy(&s, src + i * sizeof(S), sizeof(S));
        dst[i] = f(s);
      }
    };
    if constexpr (std::is_floating_point_v<T>) {
      switch (t.dtype) {
        case DType::F64:
          return each(double{}, [](double v) { return static_cast<T>(v); });
        case DType::F32:
          if constexpr (std::is_same_v<T, float>) {
            if (n) std::memcpy(dst, src, n * sizeof(float));
            return;
          } else {
            return each(float{}, [](float v) { return static_cast<T>(v); });
          }
        case DType::F16:
          return each(std::uint16_t{}, [](std::uint16_t v) { return static_cast<T>(half_to_float(v)); });
        case DType::BF16:
          return each(std::uint16_t{}, [](std::uint16_t v) { return static_cast<T>(bf16_to_float(bf16(v))); });
        case DType::I64:
          return each(std::int64_t{}, [](std::int64_t v) { return static_cast<T>(v); });
        case DType::I32:
          return each(std::int32_t{}, [](std::int32_t v) { return static_cast<T>(v); });
        case DType::I16:
          return each(std::int16_t{}, [](std::int16_t v) { return static_cast<T>(v); });
        case DType::I8:
          return each(std::int8_t{}, [](std::int8_t v) { return static_cast<T>(v); });
        case DType::U8:
          return each(std::uint8_t{}, [](std::uint8_t v) { return static_cast<T>(v); });
        case DType::BOOL:
          return each(std::uint8_t{}, [](std::uint8_t v) { return static_cast<T>(v != 0); });
      }
    } else {
      if (!dtype_is_integer(t.dtype))
        fail("tensor '" + t.name + "' has dtype " + std::string(dtype_name(t.dtype)) + ", expected an integer dtype");
      auto narrow = [&](auto v) {
        if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
          fail("tensor '" + t.name + "' value " + std::to_string(v) + " does not fit " +
               (sizeof(T) == 4 ? "int32" : "int64"));
        return static_cast<T>(v);
      };
      auto widen = [](auto v) { return static_cast<T>(v); };  // I16, I8 and U8 fit every target
      switch (t.dtype) {
        case DType::I64:
          return each(std::int64_t{}, narrow);
        case DType::I32:
          return each(std::int32_t{}, narrow);
        case DType::I16:
          return each(std::int16_t{}, widen);
        case DType::I8:
          return each(std::int8_t{}, widen);
        case DType::U8:
          return each(std::uint8_t{}, widen);
        case DType::BOOL:
          return each(std::uint8_t{}, [](std::uint8_t v) { return static_cast<T>(v != 0); });
        default:
          return;  // floating dtypes were refused above
      }
    }
  }

  // The single validation path of open() and from_buffer(). Only the 8-byte prefix and the
  // header are read; every tensor range is checked against the data section before use.
  void init(std::span<const std::byte> file) {
    const std::uint64_t n = header_length(file);
    data_ = file.subspan(8 + n);
    read_header(parse_header(reinterpret_cast<const char*>(file.data() + 8), n));
    check_tensors_tile_data();
  }

  /// The little-endian length prefix, checked against the limit and the file size.
  std::uint64_t header_length(std::span<const std::byte> file) const {
    if (file.size() < 8)
      fail("file is " + std::to_string(file.size()) + " bytes, too short for the 8-byte header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(file[std::size_t(i)]);
    if (n > detail::kMaxHeaderBytes)
      fail("header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(detail::kMaxHeaderBytes) +
           " bytes");
    if (n > file.size() - 8)
      fail("header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(file.size() - 8) +
           " bytes after the length prefix)");
    return n;
  }

  /// The header JSON (read_json: strict, nesting bounded, no repeated key). A tensor
  /// named twice is reported as such.
  nlohmann::json parse_header(const char* text, std::uint64_t length) const {
    const nlohmann::json header = read_json(std::string_view(text, length), [&](const JsonProblem& p) {
      if (p.kind == JsonProblem::Kind::duplicate_key && p.path.empty() && p.key != "__metadata__")
        fail("duplicate tensor name " + detail::quote(p.key));
      fail("header: " + p.message);
    });
    if (!header.is_object()) fail("header is not a JSON object");
    return header;
  }

  /// Fills metadata_ and tensors_; items() of nlohmann's std::map-backed object is
  /// already sorted by name, as find() needs.
  void read_header(const nlohmann::json& header) {
    for (auto& [name, entry] : header.items()) {
      if (name != "__metadata__") {
        tensors_.push_back(parse_entry(name, entry));
        continue;
      }
      if (!entry.is_object()) fail("__metadata__ is not an object of string -> string");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail("__metadata__ value of key '" + k + "' is not a string");
        metadata_.emplace(k, v.get<std::string>());
      }
    }
  }

  /// The tensors must tile [0, data size) exactly: no overlap, no gap, no trailing bytes.
  void check_tensors_tile_data() const {
    std::vector<const TensorInfo*> order;
    for (const auto& t : tensors_) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
      return std::pair(a->offset, a->offset + a->size) < std::pair(b->offset, b->offset + b->size);
    });
    std::uint64_t end = 0;
    const TensorInfo* prev = nullptr;
    for (const TensorInfo* t : order) {
      const std::string range = range_string(t->offset, t->offset + t->size);
      if (t->offset < end)
        fail("tensor '" + t->name + "' " + range + " overlap tensor '" + prev->name + "' ending at " +
             std::to_string(end));
      if (t->offset > end)
        fail("gap of " + std::to_string(t->offset - end) + " bytes before tensor '" + t->name + "' " + range +
             (prev ? " (previous tensor '" + prev->name + "' ends at " + std::to_string(end) + ")"
                   : std::string(" (the data section starts at 0)")));
      end = t->offset + t->size;
      prev = t;
    }
    if (end != data_.size())
      fail(std::to_string(data_.size() - end) + " trailing bytes after the last tensor (data section is " +
           std::to_string(data_.size()) + " bytes, tensors cover " + std::to_string(end) + ")");
  }

  /// One header entry, checked field by field; `t` ("tensor '<name>' ") starts every message.
  TensorInfo parse_entry(const std::string& name, const nlohmann::json& e) const {
    const std::string t = "tensor '" + name + "' ";
    if (!e.is_object() || e.size() != 3 || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail(t + "entry must be an object with exactly the keys dtype, shape and data_offsets");
    TensorInfo info;
    info.name = name;
    info.dtype = entry_dtype(t, e["dtype"]);
    info.shape = entry_shape(t, e["shape"]);
    const std::uint64_t bytes = entry_bytes(t, info.shape, info.dtype);
    const auto [begin, end] = entry_range(t, e["data_offsets"]);
    if (end - begin != bytes)
      fail(t + "shape " + shape_string(info.shape) + " with dtype " + std::string(dtype_name(info.dtype)) + " needs " +
           std::to_string(bytes) + " bytes, but " + range_string(begin, end) + " span " + std::to_string(end - begin));
    info.offset = begin;
    info.size = end - begin;
    return info;
  }

  DType entry_dtype(const std::string& t, const nlohmann::json& dt) const {
    if (!dt.is_string()) fail(t + "dtype is not a string");
    const auto d = detail::dtype_from_name(dt.get<std::string>());
    if (!d) fail(t + "has unknown dtype '" + dt.get<std::string>() + "'");
    return *d;
  }

  Shape entry_shape(const std::string& t, const nlohmann::json& sh) const {
    if (!sh.is_array()) fail(t + "shape is not an array");
    if (sh.size() > detail::kMaxRank)
      fail(t + "has rank " + std::to_string(sh.size()) + ", more than " + std::to_string(detail::kMaxRank));
    Shape shape;
    for (std::size_t i = 0; i < sh.size(); ++i) {
      const auto& x = sh[i];
      if (!x.is_number_unsigned() || x.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
        fail(t + "shape entry " + std::to_string(i) + " (" + x.dump() + ") is not a non-negative 64-bit integer");
      shape.push_back(x.get<std::int64_t>());
    }
    return shape;
  }

  /// The product of the extents and the dtype size; a zero extent makes it 0 whatever
  /// overflowed on the way.
  std::uint64_t entry_bytes(const std::string& t, const Shape& shape, DType dtype) const {
    std::uint64_t bytes = dtype_size(dtype);
    bool overflow = false;
    for (const std::int64_t extent : shape) overflow |= __builtin_mul_overflow(bytes, std::uint64_t(extent), &bytes);
    if (overflow && std::find(shape.begin(), shape.end(), 0) == shape.end())
      fail(t + "shape " + shape_string(shape) + " x " + std::to_string(dtype_size(dtype)) + " bytes overflows 64 bits");
    return bytes;
  }

  /// data_offsets [begin, end], ordered and inside the data section.
  std::pair<std::uint64_t, std::uint64_t> entry_range(const std::string& t, const nlohmann::json& off) const {
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(t + "data_offsets must be an array of two unsigned integers, got " + off.dump());
    const auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    if (begin > end) fail(t + range_string(begin, end) + " has begin > end");
    if (end > data_.size())
      fail(t + range_string(begin, end) + " lie outside the data section of " + std::to_string(data_.size()) +
           " bytes");
    return {begin, end};
  }

  static std::string range_string(std::uint64_t begin, std::uint64_t end) {
    return "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  }

  std::string path_;
  detail::Mapping mapping_;
  std::vector<std::byte> buffer_;
  std::span<const std::byte> data_;  // the data section, inside mapping_ or buffer_
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
};

class SafetensorsWriter {
 public:
  /// Raw little-endian bytes; data.size() must equal numel(shape) * dtype_size(dtype).
  void add(std::string name, DType dtype, Shape shape, std::span<const std::byte> data) {
    const std::string t = "SafetensorsWriter: tensor '" + name + "' ";
    if (name == "__metadata__") throw InvalidArgument(t + "uses the reserved name");
    if (tensors_.count(name)) throw InvalidArgument("SafetensorsWriter: duplicate tensor name '" + name + "'");
    const std::uint64_t bytes = byte_count(t, dtype, shape);
    if (bytes != data.size())
      throw InvalidArgument(t + "shape " + shape_string(shape) + " with dtype " + std::string(dtype_name(dtype)) +
                            " needs " + std::to_string(bytes) + " bytes, got " + std::to_string(data.size()));
    tensors_.emplace(std::move(name), Entry{dtype, std::move(shape), {data.begin(), data.end()}});
  }

  /// Typed convenience: float -> F32, double -> F64, int64_t -> I64, int32_t -> I32.
  template <class T>
  void add(std::string name, Shape shape, const T* data) {
    const DType d = std::is_same_v<T, float>          ? DType::F32
                    : std::is_same_v<T, double>       ? DType::F64
                    : std::is_same_v<T, std::int64_t> ? DType::I64
                                                      : DType::I32;
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t> ||
                      std::is_same_v<T, std::int32_t>,
                  "SafetensorsWriter::add supports float, double, int64_t and int32_t");
    const std::uint64_t bytes = byte_count("SafetensorsWriter: tensor '" + name + "' ", d, shape);
    add(std::move(name), d, std::move(shape), {reinterpret_cast<const std::byte*>(data), std::size_t(bytes)});
  }

  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

  /// The complete file: length prefix, space-padded header, tensors in name order.
  std::vector<std::byte> to_bytes() const {
    const std::string h = header();
    std::vector<std::byte> out(8 + h.size());
    encode_length(out.data(), h.size());
    std::memcpy(out.data() + 8, h.data(), h.size());
    for (const auto& [name, e] : tensors_) out.insert(out.end(), e.data.begin(), e.data.end());
    return out;
  }

  /// Writes `path + ".tmp"` and renames it over `path`, so a crash never leaves a half file.
  void write(const std::string& path) const {
    const std::string h = header(), tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw IoError("safetensors " + path + ": cannot create " + tmp + ": " + detail::errno_text());
    std::byte len[8];
    encode_length(len, h.size());
    bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(h.data(), 1, h.size(), f) == h.size();
    for (auto it = tensors_.begin(); ok && it != tensors_.end(); ++it)
      ok = std::fwrite(it->second.data.data(), 1, it->second.data.size(), f) == it->second.data.size();
    ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;  // data on disk before the rename
    int err = ok ? 0 : errno;
    if (std::fclose(f) != 0 && ok) {
      ok = false;
      err = errno;
    }
    const char* step = "cannot write ";
    if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
      ok = false;
      err = errno;
      step = "cannot rename ";
    }
    if (!ok) {
      std::remove(tmp.c_str());
      throw IoError("safetensors " + path + ": " + step + tmp + ": " + std::strerror(err));
    }
  }

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    std::vector<std::byte> data;
  };

  static std::uint64_t byte_count(const std::string& t, DType dtype, const Shape& shape) {
    std::uint64_t bytes = dtype_size(dtype);
    for (auto e : shape) {
      if (e < 0) throw InvalidArgument(t + "has a negative extent in shape " + shape_string(shape));
      if (__builtin_mul_overflow(bytes, std::uint64_t(e), &bytes))
        throw InvalidArgument(t + "shape " + shape_string(shape) + " overflows 64 bits");
    }
    return bytes;
  }

  static void encode_length(std::byte* out, std::uint64_t n) {
    for (int i = 0; i < 8; ++i) out[i] = std::byte((n >> (8 * i)) & 0xff);
  }

  std::string header() const {
    nlohmann::json h = nlohmann::json::object();  // std::map-backed: keys come out sorted
    if (!metadata_.empty()) h["__metadata__"] = metadata_;
    std::uint64_t offset = 0;
    for (const auto& [name, e] : tensors_) {
      h[name] = {
          {"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.data.size()}}};
      offset += e.data.size();
    }
    std::string s;
    try {
      s = h.dump();
    } catch (const nlohmann::json::exception& ex) {
      throw InvalidArgument(std::string("SafetensorsWriter: tensor name or metadata is not valid UTF-8: ") + ex.what());
    }
    s.resize((s.size() + 7) / 8 * 8, ' ');
    return s;
  }

  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace ldlm

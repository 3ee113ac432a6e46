// What a run shows on stderr while and after it runs: the progress bar, the text of every
// step (--show-steps), and the timing summary. stdout carries the results only.
#pragma once

#include <sys/ioctl.h>

#include "common.hpp"
#include "ldlm/io/utf8.hpp"

namespace ldlm::cli {

/// Draws "sampling [#####.....] 4/10 steps, 4/10 calls  3.1 calls/s" on stderr.
class ProgressBar {
 public:
  ProgressBar() : start_(std::chrono::steady_clock::now()) {}

  bool operator()(const SamplingProgress& p) const {
    constexpr int kWidth = 30;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    char bar[kWidth + 1];  // no allocation: this runs inside the sampling loop
    const int filled = kWidth * p.step / p.steps;
    for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
    bar[kWidth] = '\0';
    std::fprintf(stderr, "\rsampling [%s] %d/%d steps, %d/%d denoiser calls  %.2f calls/s", bar, p.step, p.steps,
                 p.denoiser_calls, p.total_calls, seconds > 0 ? p.denoiser_calls / seconds : 0.0);
    if (p.step == p.steps) std::fprintf(stderr, "  (%.2f s)\n", seconds);
    std::fflush(stderr);
    return true;
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// `text` safe to print: control characters as escapes (\t, \r, \x1b ...), so that a
/// sample cannot move the cursor or change the terminal; newlines too unless `newlines`.
std::string escaped(std::string_view text, bool newlines) {
  std::string s;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n' && newlines) {
      s += c;
    } else if (c == '\n' || c == '\t' || c == '\r' || c == '\\') {
      s += c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : "\\\\";
    } else if (byte < 0x20 || byte == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", byte);
      s += hex;
    } else {
      s += c;
    }
  }
  return s;
}

/// `text` with every byte of an ill-formed UTF-8 sequence replaced by U+FFFD, which is
/// what a terminal shows for it: the drawing's widths are counted on what is shown.
std::string valid_utf8(std::string_view text) {
  std::string s;
  while (const auto error = ldlm::detail::find_invalid_utf8(text)) {
    s.append(text.substr(0, error->offset)) += "\xEF\xBF\xBD";
    text.remove_prefix(error->offset + 1);
  }
  return s.append(text);
}

/// The columns a code point takes on a terminal: 0 for combining marks and zero-width
/// spaces, 2 for East Asian wide characters and emoji, else 1 (wcwidth's main cases,
/// without depending on the locale).
std::size_t columns_of(char32_t c) {
  if ((c >= 0x300 && c <= 0x36F) || (c >= 0x200B && c <= 0x200F)) return 0;
  if ((c >= 0x1100 && c <= 0x115F) || (c >= 0x2E80 && c <= 0xA4CF) || (c >= 0xAC00 && c <= 0xD7A3) ||
      (c >= 0xF900 && c <= 0xFAFF) || (c >= 0xFE30 && c <= 0xFE4F) || (c >= 0xFF00 && c <= 0xFF60) ||
      (c >= 0xFFE0 && c <= 0xFFE6) || (c >= 0x1F300 && c <= 0x1F64F) || (c >= 0x1F900 && c <= 0x1F9FF) ||
      (c >= 0x20000 && c <= 0x3FFFD))
    return 2;
  return 1;
}

/// --show-steps: the text (or ids) that every step's x0 prediction decodes to, on stderr.
/// When stderr is a terminal, one drawing (a "step i/N  t=..." header, then each sample)
/// is redrawn in place, cut to the terminal's height; else every step prints one line per
/// sample, "step i/N t=0.512 [sample b] TEXT", with newlines escaped as \n.
class StepView {
 public:
  /// `erase_at_end`: remove the last drawing, since the final samples follow on the same
  /// terminal.
  StepView(const std::optional<Tokenizer>& tokenizer, bool terminal, bool erase_at_end)
      : tokenizer_(tokenizer), terminal_(terminal), erase_at_end_(erase_at_end) {}

  bool operator()(const StepTokens& step) {
    const Index B = step.tokens.dimension(0);
    char header[96];
    std::snprintf(header, sizeof header, terminal_ ? "step %d/%d  t=%.3f" : "step %d/%d t=%.3f", step.progress.step,
                  step.progress.steps, step.t);
    std::string out;
    if (!terminal_) {
      for (Index b = 0; b < B; ++b)
        out += std::string(header) + " [sample " + std::to_string(b + 1) + "] " +
               escaped(sample_text(step.tokens, b), false) + "\n";
    } else {
      out = erase();
      std::vector<std::string> lines = {header};
      for (Index b = 0; b < B; ++b) {
        if (B > 1) lines.push_back("--- sample " + std::to_string(b + 1) + " of " + std::to_string(B) + " ---");
        std::istringstream text(escaped(valid_utf8(sample_text(step.tokens, b)), true));
        for (std::string line; std::getline(text, line);) lines.push_back(line);
      }
      if (!(erase_at_end_ && step.progress.step == step.progress.steps)) out += draw(lines);
    }
    std::fputs(out.c_str(), stderr);
    std::fflush(stderr);
    return true;
  }

 private:
  std::string sample_text(const TokenTensor& tokens, Index b) const {
    const Index T = tokens.dimension(1);
    const std::span<const std::int64_t> row(tokens.data() + b * T, static_cast<std::size_t>(T));
    if (tokenizer_) return tokenizer_->decode(row);
    std::string s;
    for (const std::int64_t id : row) {
      if (!s.empty()) s += ' ';
      s += std::to_string(id);
    }
    return s;
  }

  /// Back to the first row of the last drawing, clearing each row on the way up. Not
  /// "clear to the end of the screen" from there: tmux copies the screen into its history
  /// when that is done at the top left corner, which a drawing as tall as the terminal reaches.
  std::string erase() {
    if (rows_ == 0) return "";
    std::string s = "\r";
    for (; rows_ > 0; --rows_) s += "\x1b[1A\x1b[2K";
    return s;
  }

  /// The bytes of `line` (valid UTF-8) that fit in `max_rows` rows of `columns`, and the
  /// rows they take.
  static std::pair<std::size_t, std::size_t> fit(std::string_view line, std::size_t columns, std::size_t max_rows) {
    if (max_rows == 0) return {0, 0};
    std::size_t rows = 1, column = 0, i = 0;
    while (i < line.size()) {
      std::size_t next = i;
      const std::size_t width = columns_of(ldlm::detail::next_code_point(line, next));
      if (column + width > columns) {  // the terminal wraps before the character
        if (rows == max_rows) break;
        ++rows;
        column = 0;
      }
      column += width;
      i = next;
    }
    return {i, rows};
  }

  /// The lines, wrapped at the terminal's width and cut to its height with "...", and
  /// the rows they take, for the next erase(). One row stays free for the cursor after
  /// the last newline: a drawing that filled the screen would scroll its first row out
  /// of reach of the next erase().
  std::string draw(const std::vector<std::string>& lines) {
    winsize size{};
    const bool known = ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0 && size.ws_row > 2;
    const std::size_t columns = known ? size.ws_col : 80, budget = known ? size.ws_row - 1u : 24;
    std::size_t total = 0;
    for (const std::string& line : lines) total += fit(line, columns, budget + 1).second;
    const bool cut = total > budget;
    const std::size_t room = cut ? budget - 1 : budget;
    std::string s;
    for (const std::string& line : lines) {
      const auto [bytes, rows] = fit(line, columns, room - rows_);
      if (rows == 0) break;
      s.append(line, 0, bytes) += '\n';
      rows_ += rows;
      if (bytes < line.size()) break;
    }
    if (cut) {
      s += "...\n";
      ++rows_;
    }
    return s;
  }

  const std::optional<Tokenizer>& tokenizer_;
  bool terminal_, erase_at_end_;
  std::size_t rows_ = 0;  // terminal rows of the drawing on screen
};

/// The stages of a run and their seconds, for the timing summary.
struct RunTimes {
  double load = 0;  // opening and packing the weights, loading the tokenizer
  double encode = 0, sample = 0, preview = 0, decode = 0, total = 0;
  int steps = 0, denoiser_calls = 0, previews = 0;  // steps = 0: no sampling stage
  Index positions = 0;                              // the tokens produced, B x T

  void add(const GenerationStats& stats) {
    encode = stats.encode_seconds;
    sample = stats.sample_seconds;
    preview = stats.preview_seconds;
    decode = stats.decode_seconds;
    steps = stats.steps;
    denoiser_calls = stats.denoiser_calls;
  }
};

/// The timing summary on stderr, one line per stage, e.g.
///   ldlm: sampling    230.5 ms  10 steps, 10 denoiser calls, 23.05 ms per call
void print_times(const RunTimes& t) {
  const auto line = [](const char* stage, double seconds, const std::string& note) {
    std::fprintf(stderr, "ldlm: %-8s %9.1f ms%s%s\n", stage, seconds * 1e3, note.empty() ? "" : "  ", note.c_str());
  };
  char note[128];
  line("load", t.load, "");
  line("encode", t.encode, "");
  if (t.steps > 0) {
    std::snprintf(note, sizeof note, "%d steps, %d denoiser calls, %.2f ms per call", t.steps, t.denoiser_calls,
                  t.sample * 1e3 / std::max(1, t.denoiser_calls));
    line("sampling", t.sample, note);
  }
  if (t.previews > 0) {
    std::snprintf(note, sizeof note, "%d previews, %.2f ms each, %.1f%% of total", t.previews,
                  t.preview * 1e3 / t.previews, t.total > 0 ? 100 * t.preview / t.total : 0.0);
    line("preview", t.preview, note);
  }
  line("decode", t.decode, "");
  std::snprintf(note, sizeof note, "%lld tokens, %.1f tokens/s", static_cast<long long>(t.positions),
                t.total > 0 ? static_cast<double>(t.positions) / t.total : 0.0);
  line("total", t.total, note);
}

}  // namespace ldlm::cli

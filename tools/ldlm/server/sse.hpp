// ldlm serve: Server-Sent Events framing (the WHATWG HTML standard, §9.2). A payload is
// one JSON document, which nlohmann writes on one line, so each event is one `data:` line.
#pragma once

#include <string>
#include <string_view>

namespace ldlm::server {

inline constexpr std::string_view kEventStreamType = "text/event-stream";

/// One event carrying `payload`, which holds no newline.
inline std::string sse_event(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  out += "data: ";
  out += payload;
  out += "\n\n";
  return out;
}

/// The last event of a stream, as OpenAI's streams end.
inline std::string sse_done() { return sse_event("[DONE]"); }

}  // namespace ldlm::server

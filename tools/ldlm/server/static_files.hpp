// ldlm serve: the playground page's files (tools/ldlm/playground/, linked into the tool
// by tools/CMakeLists.txt) as a fixed table from URL path to bytes and content type.
// A request's path is looked up in the table and never reaches the file system.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ldlm_playground.hpp"

namespace ldlm::server {

struct StaticFile {
  std::string path;  // "/" for index.html, "/<name>" for every file
  std::string_view bytes;
  std::string content_type;
};

inline std::string content_type_of(std::string_view name) {
  const auto ends = [&](std::string_view suffix) { return name.ends_with(suffix); };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".json")) return "application/json";
  if (ends(".svg")) return "image/svg+xml";
  if (ends(".png")) return "image/png";
  if (ends(".ico")) return "image/x-icon";
  if (ends(".txt")) return "text/plain; charset=utf-8";
  return "application/octet-stream";
}

/// Every embedded file under "/<name>", and index.html under "/" too.
inline std::vector<StaticFile> static_files() {
  std::vector<StaticFile> files;
  for (const auto& [name, bytes] : ldlm::playground::all()) {
    // Appended rather than "/" + name: GCC 12 warns falsely (-Wrestrict) on the latter.
    std::string path = "/";
    path += name;
    files.push_back({path, bytes, content_type_of(name)});
    if (name == "index.html") files.push_back({"/", bytes, content_type_of(name)});
  }
  return files;
}

}  // namespace ldlm::server

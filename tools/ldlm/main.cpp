// The `ldlm` command line tool: parameter counts, single-module forward passes on
// named safetensors inputs (docs/model.md §Module inputs and outputs), tensor comparison,
// generation, infilling, reconstruction, GPT-2 tokenization and an HTTP service. Errors print
// "ldlm: error: ..." and exit with 2 (usage) or 1 (runtime: files, tensors,
// configuration, numerics). Each subcommand is a header of this folder.
#include "common.hpp"
#include "compare.hpp"
#include "forward.hpp"
#include "generate.hpp"
#include "infill.hpp"
#include "info.hpp"
#include "params.hpp"
#include "quantize.hpp"
#include "reconstruct.hpp"
#include "serve.hpp"
#include "tokenize.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ldlm::cli {
namespace {

struct Subcommand {
  const Command* command;
  int (*run)(const Args&);
};

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> all = {{&kParams, run_params},     {&kForward, run_forward},
                                              {&kCompare, run_compare},   {&kGenerate, run_generate},
                                              {&kInfill, run_infill},     {&kReconstruct, run_reconstruct},
                                              {&kTokenize, run_tokenize}, {&kDetokenize, run_detokenize},
                                              {&kInfo, run_info},         {&kQuantize, run_quantize},
                                              {&kServe, run_serve}};
  return all;
}

std::string main_usage() {
  std::size_t width = 0;
  for (const auto& sub : subcommands()) width = std::max(width, sub.command->name.size());
  std::string s =
      "usage: ldlm COMMAND [options]\n\n"
      "LDLM, the latent diffusion language model, in header-only C++.\n\ncommands:\n";
  for (const auto& sub : subcommands())
    s += "  " + sub.command->name + std::string(width - sub.command->name.size() + 2, ' ') + sub.command->brief + "\n";
  s += "\n'ldlm COMMAND --help' describes a command. Errors exit with 2 (usage) or 1 (runtime).\n";
  return s;
}

int run(const std::vector<std::string>& argv) {
  if (argv.empty()) throw UsageError("no command given\n" + main_usage());
  std::string name = argv[0];
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (name == "--help" || name == "-h") {
    std::cout << main_usage();
    return 0;
  }
  if (name == "help") {
    if (rest.empty()) {
      std::cout << main_usage();
      return 0;
    }
    name = rest[0];
    rest = {"--help"};
  }
  for (const auto& sub : subcommands()) {
    if (sub.command->name != name) continue;
    const Args args(*sub.command, rest);
    if (args.help()) {
      std::cout << sub.command->usage();
      return 0;
    }
    return sub.run(args);
  }
  std::vector<std::string> names;
  for (const auto& sub : subcommands()) names.push_back(sub.command->name);
  throw UsageError("unknown command '" + name + "' (commands: " + join(names, ", ") + "; see 'ldlm --help')");
}

}  // namespace
}  // namespace ldlm::cli

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // glibc raises its mmap threshold to the largest block freed (up to 32 MB); loading's
  // large buffers then come from the heap, whose freed memory stays resident. The library
  // keeps its own large buffers out of the heap; a fixed 1 MB threshold also gives back
  // the rest at once (quantizing at load: 7 MB of generate --length 1024's peak), with no
  // fault more per step (docs/performance.md §int8, "Memory").
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
  try {
    return ldlm::cli::run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const ldlm::cli::UsageError& e) {
    std::fprintf(stderr, "ldlm: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ldlm: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {  // ldlm::Error and everything else
    std::fprintf(stderr, "ldlm: error: %s\n", e.what());
    return 1;
  }
}

// main.cpp — the `attnres` program: dispatches to one subcommand and turns any
// attnres::Error into one line on stderr and exit status 1.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "core/spawn.h"
#include "core/error.h"
#include "core/file_util.h"
#include "ops/cpu/blas_kernels.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

constexpr Command kCommands[] = {
    {"train", attnres::cmd_train, "train or fine-tune a model on token files"},
    {"eval", attnres::cmd_eval, "loss and perplexity of a checkpoint over a token file"},
    {"eval-tasks", attnres::cmd_eval_tasks, "zero-shot downstream accuracy, scored as lm-evaluation-harness does"},
    {"routing", attnres::cmd_routing, "routing statistics of a checkpoint over a token file"},
    {"generate", attnres::cmd_generate, "text from a checkpoint (KV cache; greedy or sampled; batches of prompts)"},
    {"compare", attnres::cmd_compare, "matched runs of several routing modes (× seeds) and their table"},
    {"report", attnres::cmd_report, "an HTML page (offline) of comparisons and runs: curves, table, routing pictures"},
    {"export", attnres::cmd_export, "a checkpoint as a plain HF model directory (sharded, bf16) for the reference code"},
    {"bench", attnres::cmd_bench, "throughput, MFU and peak memory of full training steps"},
    {"tokenize", attnres::cmd_tokenize, "text -> token ids as JSON (or --decode ids -> text, --bench FILE)"},
    {"tokenizer-train", attnres::cmd_tokenizer_train, "learn a byte-level BPE tokenizer.json from a corpus"},
    {"prepare", attnres::cmd_prepare, "corpus (text, dirs, JSONL, gzip) -> token .bin shards"},
};

void usage(FILE* out) {
  std::fputs("usage: attnres COMMAND [flags]   (attnres COMMAND --help for its flags)\n\ncommands:\n", out);
  for (const auto& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && !std::strcmp(argv[1], attnres::kChildOf)) attnres::become_child(argc, argv);  // core/spawn.h
  attnres::use_best_blas_kernels(argv);
  // The OpenBLAS kernels chosen for this CPU (blas_kernels.h), for the
  // Python package, which sets them before it loads the library: not a command.
  if (argc == 2 && !std::strcmp(argv[1], "--blas-core")) {
    const char* core = std::getenv("OPENBLAS_CORETYPE");
    std::printf("%s\n", core ? core : "");
    return 0;
  }
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      const int rc = c.run(argc - 2, argv + 2);
      attnres::flush_stdout();  // a failed write of the output is a failed command
      return rc;
    } catch (const attnres::Error& e) {
      std::fprintf(stderr, "attnres %s: error: %s\n", c.name, e.what());
      return 1;
    } catch (const attnres::InternalError& e) {
      std::fprintf(stderr, "attnres %s: internal error (a bug in attnres; please report it): %s\n", c.name, e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attnres %s: internal error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "attnres: unknown command '%s' (attnres --help lists them)\n", argv[1]);
  return 2;
}

// report.cpp — `attnres report RUN_DIR… --out report.html`: one self-contained
// HTML page of comparisons and training runs (report/report.h).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/file_util.h"
#include "report/report.h"

namespace attnres {

int cmd_report(int argc, char** argv) {
  struct {
    std::string out, vega_dir;
  } o;
  OptionList opts("report",
                  "attnres report RUN_DIR... --out report.html: one HTML page (opens offline) with the validation "
                  "curves,\nfinal perplexities, the table, and the routing pictures of `attnres compare` directories "
                  "or training runs.");
  opts.add(o.out, {"out", "report.html", "the page to write"});
  opts.add(o.vega_dir,
           {"vega-dir", "", "node_modules holding vega, vega-lite, vega-embed (default: scripts/fetch_vega.sh's)"});
  // Directories are the arguments that are neither flags nor flag values.
  std::vector<std::string> dirs;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      rest.push_back(argv[i]);
      if (a.find('=') == std::string::npos && a != "--help" && i + 1 < argc) rest.push_back(argv[++i]);
    } else {
      dirs.push_back(a);
    }
  }
  if (!opts.parse(static_cast<int>(rest.size()), rest.data())) return 0;
  {  // the page may not replace a file the report reads
    std::vector<NamedPath> inputs;
    for (const std::string& d : dirs) {
      std::error_code ec;
      for (auto it = std::filesystem::recursive_directory_iterator(d, ec);
           !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
        if (it.depth() >= 2) it.disable_recursion_pending();  // a comparison's runs' files, not their checkpoints
        const std::string ext = it->path().extension().string();
        if (it->is_regular_file() && (ext == ".json" || ext == ".jsonl")) inputs.push_back({"the run file", it->path().string()});
      }
    }
    check_outputs_apart({{"--out", o.out}}, inputs);
  }
  const nlohmann::json data = read_report_data(dirs);  // the runs are checked before Vega is looked for
  for (const auto& w : data["warnings"]) std::fprintf(stderr, "report: warning: %s\n", w.get<std::string>().c_str());
  write_report(data, o.out, find_vega_dir(o.vega_dir));
  std::printf("report: %s\n", o.out.c_str());
  return 0;
}

}  // namespace attnres

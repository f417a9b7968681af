// report_test.cpp — the page's data: runs read and checked before Vega, one colour per mode.
#include "report/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/file_util.h"
#include "model/modes.h"
#include "testing/check.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;

TEST(Report, EveryModeHasOneColourOnEveryPage) {
  testing::TempDir tmp("report");
  const std::string cmp = tmp.path() + "/cmp", vega = tmp.path() + "/vega";
  fs::create_directories(cmp);
  for (const char* s : {"vega/build/vega.min.js", "vega-lite/build/vega-lite.min.js", "vega-embed/build/vega-embed.min.js"}) {
    fs::create_directories(fs::path(vega + "/" + s).parent_path());
    write_file_atomic(vega + "/" + s, "// stand-in\n");
  }
  // A comparison of two routed modes only: the colours are still those of
  // the whole table (block keeps its place after baseline).
  // (Each run's record has every field compare writes: check_run_record.)
  nlohmann::json runs = nlohmann::json::array();
  for (const char* mode : {"delta_block", "block"})
    runs.push_back({{"mode", mode}, {"seed", 1}, {"dir", cmp + "/" + mode}, {"steps", 2}, {"val_loss", 5.0},
                    {"val_ppl", 148.4}, {"tok_per_s", 1000.0}, {"peak_rss_bytes", 1 << 20}, {"params", 100},
                    {"cut", false}, {"val_curve", nlohmann::json::array()}, {"loss_curve", nlohmann::json::array()}});
  write_file_atomic(cmp + "/results.json",
                    nlohmann::json({{"runs", runs}, {"settings", nlohmann::json::object()}, {"notes", nlohmann::json::array()}}).dump());
  const nlohmann::json data = read_report_data({cmp});
  write_report(data, tmp.path() + "/r.html", vega);
  const std::string page = read_file(tmp.path() + "/r.html");
  std::string modes;
  for (const ModeName& m : mode_names()) modes += cat(modes.empty() ? "" : ",", "\"", m.name, "\"");
  EXPECT_NE(page.find("\"modes\":[" + modes + "]"), std::string::npos);
  EXPECT_NE(page.find("color: modeColor"), std::string::npos);
  EXPECT_EQ(page.find("color: {field: 'mode'"), std::string::npos) << "a chart colours modes by its own scale";
}

TEST(Report, TheRunsAreCheckedBeforeVegaIsLookedFor) {
  testing::TempDir tmp("report");
  try {
    read_report_data({tmp.path() + "/nothing"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("neither a comparison"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_report_data({}), Error);
  try {
    find_vega_dir(tmp.path() + "/no-vega");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/fetch_vega.sh"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnres

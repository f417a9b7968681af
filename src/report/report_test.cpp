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

// Empty stand-ins for the three Vega builds the page inlines (the page's data is what is tested).
void stand_in_vega(const std::string& vega) {
  for (const char* s : {"vega/build/vega.min.js", "vega-lite/build/vega-lite.min.js", "vega-embed/build/vega-embed.min.js"}) {
    fs::create_directories(fs::path(vega + "/" + s).parent_path());
    write_file_atomic(vega + "/" + s, "// stand-in\n");
  }
}

TEST(Report, EveryModeHasOneColourOnEveryPage) {
  testing::TempDir tmp("report");
  const std::string cmp = tmp.path() + "/cmp", vega = tmp.path() + "/vega";
  fs::create_directories(cmp);
  stand_in_vega(vega);
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

// Issue 48: every string of the runs reaches the page as text — a mode, a
// directory, a router, a note that is HTML (or "<!--<script", which would
// leave the embedded data's script never closed) is escaped in the table and
// \u003c-escaped in the data.  tests/report/render.py loads such a page in Chromium.
TEST(Report, HostileStringsReachThePageAsText) {
  testing::TempDir tmp("report");
  const std::string cmp = tmp.path() + "/cmp", vega = tmp.path() + "/vega";
  fs::create_directories(cmp);
  stand_in_vega(vega);
  const std::string img = "<img src=x onerror=\"document.body.dataset.pwned=1\">";
  nlohmann::json run = {{"mode", img}, {"seed", 1}, {"dir", cmp + "/a<!--<script>b"}, {"steps", 2},
                        {"val_loss", 5.0}, {"val_ppl", 148.4}, {"tok_per_s", 1000.0}, {"peak_rss_bytes", 1 << 20},
                        {"params", 100}, {"cut", false}, {"val_curve", nlohmann::json::array()},
                        {"loss_curve", nlohmann::json::array()}};
  write_file_atomic(cmp + "/results.json",
                    nlohmann::json({{"runs", {run}}, {"settings", {{"config", img}}}, {"notes", {img + "</script>"}}}).dump());
  write_report(read_report_data({cmp}), tmp.path() + "/r.html", vega);
  const std::string page = read_file(tmp.path() + "/r.html");
  EXPECT_EQ(page.find("<img"), std::string::npos) << "a mode, a setting or a note became an element";
  EXPECT_EQ(page.find("<!--"), std::string::npos);
  EXPECT_EQ(page.find("</script>\""), std::string::npos);
  EXPECT_NE(page.find("&lt;img src=x onerror=&quot;document.body.dataset.pwned=1&quot;&gt;"), std::string::npos);
  EXPECT_NE(page.find("\\u003cimg src=x onerror="), std::string::npos);  // in the data, as text
  EXPECT_NE(page.find("a\\u003c!--\\u003cscript\\u003eb"), std::string::npos);
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

// A run's interventions (compare --interventions) are checked as its other
// fields are: a malformed one is an Error naming the file, the run and the part.
TEST(Report, MalformedInterventionsAreNamed) {
  testing::TempDir tmp("report");
  const nlohmann::json run = {{"mode", "block"}, {"seed", 1}, {"dir", "x"}, {"steps", 2}, {"val_loss", 1.0},
                              {"val_ppl", 2.7}, {"tok_per_s", 10.0}, {"peak_rss_bytes", 1}, {"params", 1},
                              {"cut", false}, {"val_curve", nlohmann::json::array()},
                              {"loss_curve", nlohmann::json::array()}};
  const nlohmann::json effect = {{"dloss", 0.1}, {"se", nullptr}};
  const nlohmann::json good = {{"routers", {{{"router", "final"}, {"sources", {"embed", "partial"}}, {"mass", {0.4, 0.6}},
                                             {"ablate", {effect, effect}}, {"mean_routing", effect},
                                             {"uniform_routing", effect}}}}};
  auto with = [&](const nlohmann::json& iv) {
    nlohmann::json r = run;
    r["interventions"] = iv;
    write_file_atomic(tmp.path() + "/results.json",
               nlohmann::json({{"runs", {r}}, {"settings", nlohmann::json::object()}, {"notes", nlohmann::json::array()}})
                   .dump());
    return read_report_data({tmp.path()});
  };
  EXPECT_EQ(with(good)["runs"][0]["interventions"], good);
  nlohmann::json short_mass = good;
  short_mass["routers"][0]["mass"] = {0.4};
  nlohmann::json no_mean = good;
  no_mean["routers"][0].erase("mean_routing");
  nlohmann::json text_dloss = good;
  text_dloss["routers"][0]["ablate"][1]["dloss"] = "big";
  for (const auto& [iv, message] : std::vector<std::pair<nlohmann::json, std::string>>{
           {nlohmann::json::array(), "runs[0]: 'interventions' is [], not an object"},
           {nlohmann::json::object(), "runs[0]: interventions: has no 'routers' list"},
           {short_mass, "routers[0] has 2 sources but 1 masses and 2 ablations"},
           {no_mean, "routers[0] lacks mean_routing"},
           {text_dloss, "routers[0].ablate[1] is"}}) {
    try {
      with(iv);
      ADD_FAILURE() << "accepted: " << iv.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("results.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace attnres

// json_util.cpp — see json_util.h.
#include "core/json_util.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace attnres {

namespace {

// Measures nesting depth with the SAX interface (no tree), stopping at the limit.
struct DepthProbe : nlohmann::json_sax<nlohmann::json> {
  int depth = 0, most = 0, limit = 0;
  bool open() {
    most = std::max(most, ++depth);
    return depth <= limit;  // false stops the parse
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return --depth, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& where, int max_depth) {
  DepthProbe probe;
  probe.limit = max_depth;
  try {
    nlohmann::json::sax_parse(text, &probe);
  } catch (const nlohmann::json::exception&) {
    // reported by the real parse below
  }
  if (probe.most > max_depth) fail(where, ": JSON nested deeper than ", max_depth, " levels");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // The library's message quotes what it read last, which can be anything.
    std::string what = e.what();
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    fail(where, ": malformed JSON: ", what);
  }
}

bool is_int64(const nlohmann::json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
  return j.is_number_integer();
}

std::string brief(const nlohmann::json& j, size_t max_chars) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace attnres

// json_util.cpp — see json_util.h.
#include "core/json_util.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

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
  } catch (const nlohmann::json::parse_error& e) {
    // The library's message says "line 1, column N" of the text and quotes
    // what it read last, which can be any bytes: the byte offset and the
    // reason only, and the text near it with every byte that is not printable
    // ASCII shown as \xHH.
    std::string why = e.what();
    const size_t dash = why.find(" - ");
    why = dash == std::string::npos ? std::string("syntax error") : why.substr(dash + 3);
    if (const size_t last = why.find("; last read:"); last != std::string::npos) why.erase(last);
    const size_t at = std::min(e.byte > 0 ? e.byte - 1 : 0, text.size());
    const size_t from = at > 20 ? at - 20 : 0;
    const std::string near = visible(text.substr(from, std::min<size_t>(40, text.size() - from)));
    if (why.size() > 120) why = why.substr(0, 120) + "...";
    fail(where, ": malformed JSON at byte ", at + 1, ": ", why, near.empty() ? "" : cat(" (near '", near, "')"));
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": malformed JSON: ", std::string(e.what()).substr(0, 200));
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

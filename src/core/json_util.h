// json_util.h — reading JSON that comes from users and files.
//
// parse_json bounds the nesting depth (a 100k-level value would otherwise
// overflow the stack in any recursive walk of it, such as an error message
// that prints it) and turns every failure of the JSON library — syntax, a
// number out of range like 1e400, too deep — into one Error line naming
// `where`.  brief() prints a value for a message, cut to a few dozen characters.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace attnres {

constexpr int kMaxJsonDepth = 64;

nlohmann::json parse_json(std::string_view text, const std::string& where, int max_depth = kMaxJsonDepth);
std::string brief(const nlohmann::json& j, size_t max_chars = 60);
// True for a JSON integer that fits int64 (not a float such as 1e19 or 2.5,
// whose conversion to an integer would be undefined).
bool is_int64(const nlohmann::json& j);

}  // namespace attnres

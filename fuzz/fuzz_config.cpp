// fuzz_config.cpp — config.json text: parsed with the depth bound, read as a
// Config, and laid out as parameters; anything else is an attnres::Error.
#include <string_view>

#include "core/error.h"
#include "core/json_util.h"
#include "model/config.h"
#include "model/params.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto j = attnres::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    const attnres::Config c = attnres::Config::from_json(j, "fuzz");
    attnres::ParamLayout layout(c);
    (void)layout.total();
    (void)c.to_json();
  } catch (const attnres::Error&) {
  }
  return 0;
}

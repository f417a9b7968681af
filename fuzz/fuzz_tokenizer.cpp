// fuzz_tokenizer.cpp — tokenizer.json text: loaded, then used to encode and
// decode a fixed sample; anything else is an attnres::Error.
#include <string_view>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const attnres::Tokenizer tok =
        attnres::Tokenizer::from_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    const auto ids = tok.encode("Hello, world! 123 <|endoftext|> héllo\n\n  x");
    (void)tok.decode(ids);
  } catch (const attnres::Error&) {
  }
  return 0;
}

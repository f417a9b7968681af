// fuzz_token_file.cpp — a .bin token shard: its header checked, its ids
// checked against a vocabulary and read.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnres::fuzz::MemFile f(data, size);
  try {
    attnres::TokenFile t(f.path());
    t.check_vocab(1 << 16);
    std::vector<int32_t> out(std::min<size_t>(t.size(), 64));
    t.read(0, out);
  } catch (const attnres::Error&) {
  }
  return 0;
}

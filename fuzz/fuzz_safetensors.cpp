// fuzz_safetensors.cpp — the safetensors reader on arbitrary bytes: every
// input is either rejected with an attnres::Error or read in full.
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnres::fuzz::MemFile f(data, size);
  try {
    attnres::SafeTensorsReader r(f.path());
    for (const std::string& name : r.names()) {
      const attnres::TensorInfo& t = r.info(name);
      if (t.numel() > (1 << 20)) continue;  // valid, just large: not what is being tested
      std::vector<float> out(static_cast<size_t>(t.numel()));
      std::vector<uint16_t> out16(out.size());
      try {
        r.read_float(name, t.shape, out);
        r.read_bf16(name, t.shape, out16);
        r.release(name);
      } catch (const attnres::Error&) {  // a non-float dtype
      }
    }
  } catch (const attnres::Error&) {
  }
  return 0;
}

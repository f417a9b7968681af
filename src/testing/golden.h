// golden.h — the golden cases the PyTorch oracle writes (tests/golden/, see
// tests/oracle/README.md): their directory and their names.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace attnres::testing {

inline const std::string kGoldenDir = std::string(ATTNRES_SOURCE_DIR) + "/tests/golden/";

// Every case directory under tests/golden/, sorted.
inline std::vector<std::string> golden_cases() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(kGoldenDir))
    if (e.is_directory()) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace attnres::testing

// mapped_file_test.cpp — a file truncated while mapped ends the process with
// one line naming it (exit 1), not "Bus error".
#include "io/mapped_file.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "io/safetensors.h"
#include "io/token_file.h"
#include "testing/check.h"

namespace attnres {
namespace {

TEST(MappedFileDeathTest, ATokenFileTruncatedWhileMappedIsAClearError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  testing::TempDir tmp("mapped");
  const std::string path = tmp.path() + "/train.bin";
  write_token_file(path, std::vector<uint32_t>(1 << 20, 70000u));  // 4 MiB of uint32 tokens
  EXPECT_EXIT(
      {
        TokenFile f(path);
        if (::truncate(path.c_str(), 4096) != 0) std::abort();
        std::filesystem::remove_all(tmp.path());  // the mapping outlives the name; nothing is left behind
        uint64_t sum = 0;
        for (size_t i = 0; i < f.size(); i += 1024) sum += f[i];
        std::printf("%llu\n", static_cast<unsigned long long>(sum));  // not reached
        std::exit(0);
      },
      ::testing::ExitedWithCode(1), "train.bin: the file changed while in use");
}

TEST(MappedFileDeathTest, ASafetensorsFileTruncatedWhileMappedIsAClearError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  testing::TempDir tmp("mapped");
  const std::string path = tmp.path() + "/model.safetensors";
  std::vector<float> w(1 << 20, 0.5f);
  SafeTensorsWriter sw;
  sw.add_f32("w", {1024, 1024}, w);
  sw.write(path);
  EXPECT_EXIT(
      {
        SafeTensorsReader r(path);
        if (::truncate(path.c_str(), 4096) != 0) std::abort();
        std::filesystem::remove_all(tmp.path());
        const std::vector<float> back = r.read_float("w");
        std::exit(back.empty() ? 2 : 0);  // not reached
      },
      ::testing::ExitedWithCode(1), "model.safetensors: the file changed while in use");
}

// A SIGBUS outside every registered mapping keeps its default action.
TEST(MappedFileDeathTest, OtherSigbusKeepsItsDefault) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizer's own SIGBUS handler is the default there";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "the sanitizer's own SIGBUS handler is the default there";
#endif
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  testing::TempDir tmp("mapped");
  const std::string path = tmp.path() + "/t.bin";
  write_token_file(path, std::vector<uint32_t>(100, 1u));
  EXPECT_EXIT(
      {
        TokenFile f(path);  // installs the handler
        std::filesystem::remove_all(tmp.path());
        ::raise(SIGBUS);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

}  // namespace
}  // namespace attnres

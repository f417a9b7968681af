// comm_test.cpp — the ranks' ranges of an arena, and a world of one (the
// collectives of several ranks are tested end to end by tests/distributed/mpi.py).
#include "distributed/comm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace attnres {
namespace {

TEST(Shards, CoverTheArenaInCacheLineUnits) {
  for (int64_t total : {0, 5, 16, 17, 1000, 1000003}) {
    for (int ranks : {1, 2, 3, 4, 7}) {
      const Shards s(total, ranks);
      ASSERT_EQ(s.bounds.size(), static_cast<size_t>(ranks) + 1);
      EXPECT_EQ(s.lo(0), 0);
      EXPECT_EQ(s.hi(ranks - 1), total);
      int64_t smallest = total, largest = 0;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_LE(s.lo(r), s.hi(r));
        if (r > 0) {
          EXPECT_EQ(s.lo(r), s.hi(r - 1));
        }
        if (r + 1 < ranks) {
          EXPECT_EQ(s.hi(r) % 16, 0) << "a range ends on a 16-float unit";
        }
        const int64_t units = (r + 1 < ranks ? s.size(r) : s.size(r) - total % 16) / 16;
        smallest = std::min(smallest, units);
        largest = std::max(largest, units);
      }
      EXPECT_LE(largest - smallest, 1) << total << " over " << ranks;
    }
  }
}

TEST(Comm, AWorldOfOneExchangesNothing) {
  auto c = Comm::single();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_TRUE(c->root());
  std::vector<float> buf = {1, 2, 3};
  const Shards s(3, 1);
  c->reduce_scatter(buf.data(), s, "test");
  c->all_gather(buf.data(), s, "test");
  EXPECT_EQ(buf, (std::vector<float>{1, 2, 3}));
  // A world of one reads its own arena through a RangeReader, piece by piece.
  RangeReader reader(*c, s, buf.data(), 1, 2, "test");
  std::vector<float> a(2), b(1);
  reader.read(0, a);
  reader.read(2, b);
  reader.finish();
  EXPECT_EQ(a, (std::vector<float>{1, 2}));
  EXPECT_EQ(b, (std::vector<float>{3}));
  EXPECT_EQ(c->all_gather(std::vector<double>{4, 5}, "test"), (std::vector<double>{4, 5}));
  c->barrier("test");
}

}  // namespace
}  // namespace attnres

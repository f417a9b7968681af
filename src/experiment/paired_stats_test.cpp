// paired_stats_test.cpp — the t distribution, the paired interval and Holm's
// correction against reference values (scipy 1.17.1 in the peers' venv:
// scipy.stats.t.cdf / t.ppf, scipy.stats.ttest_1samp(d, 0) with its
// confidence_interval(0.95); Holm worked by hand).
#include "experiment/paired_stats.h"

#include <cmath>

#include <gtest/gtest.h>

namespace attnres {
namespace {

TEST(PairedStats, StudentTMatchesScipy) {
  struct Case {
    double x, nu, cdf;
  };
  for (const Case& c : {Case{0.5, 1, 0.6475836176504333}, Case{2.0, 1, 0.8524163823495667},
                        Case{-1.3, 2, 0.16162351590802015}, Case{2.5, 4, 0.966616727594006},
                        Case{0.1, 30, 0.5394951941048645}, Case{12.0, 3, 0.9993774920996054}})
    EXPECT_NEAR(student_t_cdf(c.x, c.nu), c.cdf, 1e-13) << c.x << " " << c.nu;
  struct Quantile {
    double p, nu, x;
  };
  for (const Quantile& q : {Quantile{0.975, 1, 12.706204736174694}, Quantile{0.975, 2, 4.302652729749462},
                            Quantile{0.975, 4, 2.7764451051977934}, Quantile{0.975, 9, 2.262157162798205},
                            Quantile{0.6, 3, 0.2766706623326898}})
    EXPECT_NEAR(student_t_quantile(q.p, q.nu), q.x, 1e-11 * q.x) << q.p << " " << q.nu;
  EXPECT_DOUBLE_EQ(student_t_cdf(0, 5), 0.5);
}

TEST(PairedStats, PairedIntervalAndPMatchScipy) {
  // Three seeds: block below baseline by 0.21, 0.18, 0.25 nats.
  const PairedDifference three = paired_difference({-0.21, -0.18, -0.25});
  EXPECT_EQ(three.n, 3);
  EXPECT_NEAR(three.mean, -0.21333333333333335, 1e-15);
  EXPECT_NEAR(*three.lo, -0.30057338268468464, 1e-12);
  EXPECT_NEAR(*three.hi, -0.12609328398198205, 1e-12);
  EXPECT_NEAR(*three.p, 0.00891261906798256, 1e-12);
  // Two seeds 0.2 apart: the interval spans ±1.27 nats (t = 12.7 on one degree of freedom).
  const PairedDifference two = paired_difference({-0.30, -0.10});
  EXPECT_NEAR(*two.lo, -1.4706204736174693, 1e-11);
  EXPECT_NEAR(*two.hi, 1.0706204736174694, 1e-11);
  EXPECT_NEAR(*two.p, 0.2951672353008665, 1e-12);
  // One seed: a difference, no interval.
  const PairedDifference one = paired_difference({-0.2});
  EXPECT_EQ(one.n, 1);
  EXPECT_FALSE(one.lo.has_value() || one.p.has_value());
  // Every pair alike: the interval is the point.
  const PairedDifference same = paired_difference({-0.1, -0.1});
  EXPECT_EQ(*same.lo, -0.1);
  EXPECT_EQ(*same.p, 0.0);
}

TEST(PairedStats, HolmStepsDown) {
  // Sorted: 0.01·4 = 0.04, 0.03·3 = 0.09, 0.04·2 = 0.08 → 0.09 (monotone), 0.20·1 = 0.20.
  const std::vector<double> adj = holm({0.01, 0.04, 0.03, 0.20});
  const std::vector<double> want = {0.04, 0.09, 0.09, 0.20};
  ASSERT_EQ(adj.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(adj[i], want[i], 1e-15) << i;
  EXPECT_EQ(holm({0.6, 0.7}), (std::vector<double>{1.0, 1.0}));  // capped at 1
  EXPECT_TRUE(holm({}).empty());
}

}  // namespace
}  // namespace attnres

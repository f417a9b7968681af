// paired_stats.h — what a comparison of a few seeds can say: the paired
// difference of each mode to baseline with a 95% confidence interval
// (Student's t over the seeds' differences) and a p-value corrected for the
// number of modes compared (Holm).
//
// Paired: the runs of one seed share their initial base weights and their
// data order (experiment/comparison.h), so mode m's seed s is compared with
// baseline's seed s, d_s = L(m, s) − L(baseline, s), and the seeds' common
// noise cancels.  With n pairs, d̄ = mean d_s, s = their standard deviation
// (n − 1), se = s/√n, t = d̄/se on n − 1 degrees of freedom:
//   95% interval  d̄ ± t_{0.975, n−1} · se       (n = 2: t = 12.71, wide),
//   p (two-sided) 2 · (1 − F_t(|t|; n − 1)).
// Holm over k p-values: sorted ascending p_(1) ≤ … ≤ p_(k),
//   p_adj(i) = max over j ≤ i of min(1, (k − j + 1) · p_(j)).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace attnres {

// F_t(x; ν): Student's t distribution function with ν > 0 degrees of freedom.
double student_t_cdf(double x, double nu);
// Its inverse: the x with F_t(x; ν) = p, for p in (0, 1).
double student_t_quantile(double p, double nu);
// I_x(a, b): the regularized incomplete beta function (x in [0, 1]; a, b > 0).
double incomplete_beta(double x, double a, double b);

struct PairedDifference {
  int64_t n = 0;            // pairs
  double mean = 0;          // d̄, nats
  // With n ≥ 2: the interval and the two-sided p (unadjusted).
  std::optional<double> lo, hi, p;
};
// d̄, its 95% interval and p over the pairs' differences.  All differences
// equal: the interval is that point and p is 0 (1 when they are all 0).
PairedDifference paired_difference(const std::vector<double>& diffs);

// Holm's step-down adjustment of p-values (in their order).
std::vector<double> holm(const std::vector<double>& p);

}  // namespace attnres

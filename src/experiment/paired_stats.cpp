// paired_stats.cpp — see paired_stats.h.
#include "experiment/paired_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace attnres {

namespace {

// The continued fraction of I_x(a, b) (modified Lentz), for x < (a + 1)/(a + b + 2):
//   I_x(a, b) = x^a (1 − x)^b / (a B(a, b)) · 1/(1 + d1/(1 + d2/(1 + …))),
//   d_{2m+1} = −(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)),
//   d_{2m}   = m (b − m) x / ((a + 2m − 1)(a + 2m)).
double beta_fraction(double x, double a, double b) {
  constexpr double kTiny = 1e-300, kEps = 1e-16;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double f = d;
  for (int m = 1; m <= 10000; ++m) {
    for (int half = 0; half < 2; ++half) {
      const double num = half == 0 ? m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
                                   : -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
      d = 1 + num * d;
      if (std::fabs(d) < kTiny) d = kTiny;
      c = 1 + num / c;
      if (std::fabs(c) < kTiny) c = kTiny;
      d = 1 / d;
      const double step = c * d;
      f *= step;
      if (half == 1 && std::fabs(step - 1) < kEps) return f;
    }
  }
  return f;  // converged to double precision long before, for the a, b used here
}

}  // namespace

double incomplete_beta(double x, double a, double b) {
  ATTNRES_CHECK(a > 0 && b > 0 && x >= 0 && x <= 1, "incomplete_beta(", x, ", ", a, ", ", b, ")");
  if (x == 0 || x == 1) return x;
  // x^a (1 − x)^b / B(a, b), in logs.
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  // I_x(a, b) = 1 − I_{1−x}(b, a): the fraction converges fast on the side below the mean.
  if (x < (a + 1) / (a + b + 2)) return front * beta_fraction(x, a, b) / a;
  return 1 - front * beta_fraction(1 - x, b, a) / b;
}

// F_t(x; ν) = 1 − ½ I_{ν/(ν + x²)}(ν/2, ½) for x ≥ 0, and 1 − F_t(−x; ν) below.
double student_t_cdf(double x, double nu) {
  ATTNRES_CHECK(nu > 0, "student_t_cdf: ν = ", nu);
  if (std::isinf(x)) return x > 0 ? 1 : 0;
  const double tail = 0.5 * incomplete_beta(nu / (nu + x * x), nu / 2, 0.5);
  return x >= 0 ? 1 - tail : tail;
}

// By bisection on F_t (increasing): 200 halvings of a bracket that holds it.
double student_t_quantile(double p, double nu) {
  ATTNRES_CHECK(p > 0 && p < 1 && nu > 0, "student_t_quantile(", p, ", ", nu, ")");
  double lo = -1, hi = 1;
  while (student_t_cdf(lo, nu) > p) lo *= 2;
  while (student_t_cdf(hi, nu) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-15 * std::max(1.0, std::fabs(lo)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, nu) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

PairedDifference paired_difference(const std::vector<double>& diffs) {
  PairedDifference r;
  r.n = static_cast<int64_t>(diffs.size());
  if (r.n == 0) return r;
  const double n = static_cast<double>(r.n);
  r.mean = std::accumulate(diffs.begin(), diffs.end(), 0.0) / n;
  if (r.n < 2) return r;
  double ss = 0;
  for (double d : diffs) ss += (d - r.mean) * (d - r.mean);
  const double se = std::sqrt(ss / (n - 1) / n), nu = n - 1;
  if (se == 0) {  // every pair the same difference
    r.lo = r.hi = r.mean;
    r.p = r.mean == 0 ? 1.0 : 0.0;
    return r;
  }
  const double half = student_t_quantile(0.975, nu) * se;
  r.lo = r.mean - half;
  r.hi = r.mean + half;
  r.p = 2 * (1 - student_t_cdf(std::fabs(r.mean / se), nu));
  return r;
}

std::vector<double> holm(const std::vector<double>& p) {
  const size_t k = p.size();
  std::vector<size_t> order(k);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
  std::vector<double> adj(k);
  double running = 0;
  for (size_t j = 0; j < k; ++j) {
    running = std::max(running, std::min(1.0, static_cast<double>(k - j) * p[order[j]]));
    adj[order[j]] = running;
  }
  return adj;
}

}  // namespace attnres

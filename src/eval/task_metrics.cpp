// task_metrics.cpp — see task_metrics.h.
#include "eval/task_metrics.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"

namespace attnres {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double mean(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

Metric mean_metric(const std::vector<double>& x) { return {mean(x), mean_stderr(x)}; }

// The first index of the largest value (np.argmax).
size_t argmax(const std::vector<double>& v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

// acc (and acc_norm) of multiple-choice documents.
TaskResult multiple_choice(const TaskSpec& task, const std::vector<Doc>& docs,
                           const std::vector<std::vector<Loglik>>& lls) {
  std::vector<double> acc, acc_norm;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<double> ll, norm;
    for (size_t i = 0; i < lls[d].size(); ++i) {
      ll.push_back(lls[d][i].ll);
      norm.push_back(lls[d][i].ll / static_cast<double>(docs[d].choice_lengths[i]));
    }
    acc.push_back(argmax(ll) == static_cast<size_t>(docs[d].gold) ? 1.0 : 0.0);
    acc_norm.push_back(argmax(norm) == static_cast<size_t>(docs[d].gold) ? 1.0 : 0.0);
  }
  TaskResult r;
  r.task = task.name;
  r.n = static_cast<int64_t>(docs.size());
  r.metrics["acc"] = mean_metric(acc);
  if (task.acc_norm) r.metrics["acc_norm"] = mean_metric(acc_norm);
  return r;
}

}  // namespace

double mean_stderr(const std::vector<double>& x) {
  if (x.size() < 2) return kNaN;
  const double mu = mean(x);
  double ss = 0;
  for (double v : x) ss += (v - mu) * (v - mu);
  return std::sqrt(ss / static_cast<double>(x.size() - 1)) / std::sqrt(static_cast<double>(x.size()));
}

PyRandom::PyRandom(uint64_t seed) {
  // init_genrand(19650218), then init_by_array with the key: the seed's 32-bit
  // words, least significant first, as many as it needs (at least one) —
  // CPython's random_seed for an int, so 2^32 + 1234 is not 1234.
  mt_[0] = 19650218u;
  for (uint32_t i = 1; i < 624; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const uint32_t words = seed >> 32 ? 2 : 1;
  uint32_t i = 1, j = 0;
  for (int k = 624; k > 0; --k) {  // max(624, key length) rounds
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + j;
    if (++i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
    if (++j >= words) j = 0;
  }
  for (int k = 623; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - i;
    if (++i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
}

uint32_t PyRandom::next() {
  if (i_ >= 624) {
    for (int k = 0; k < 624; ++k) {
      const uint32_t y = (mt_[k] & 0x80000000u) | (mt_[(k + 1) % 624] & 0x7fffffffu);
      mt_[k] = mt_[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    i_ = 0;
  }
  uint32_t y = mt_[i_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  return y ^ (y >> 18);
}

double PyRandom::random() {
  const uint32_t a = next() >> 5, b = next() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

uint32_t PyRandom::getrandbits(int k) {
  ATTNRES_CHECK(k >= 1 && k <= 32, "getrandbits(", k, ")");
  return next() >> (32 - k);
}

int64_t PyRandom::randbelow(int64_t n) {
  ATTNRES_CHECK(n > 0 && n < (int64_t{1} << 32), "randbelow(", n, ")");
  int k = 0;
  while ((n >> k) != 0) ++k;  // n.bit_length()
  int64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

// CPython's two algorithms: a partial shuffle of a pool when the population
// is smaller than the set the other would build, else rejection of repeats.
std::vector<int64_t> PyRandom::sample(int64_t n, int64_t k) {
  ATTNRES_CHECK(k >= 0 && k <= n, "sample of ", k, " from ", n);
  std::vector<int64_t> out(static_cast<size_t>(k));
  int64_t setsize = 21;
  if (k > 5) setsize += static_cast<int64_t>(std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = randbelow(n - i);
      out[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::set<int64_t> selected;
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = randbelow(n);
      while (selected.count(j)) j = randbelow(n);
      selected.insert(j);
      out[i] = j;
    }
  }
  return out;
}

double bootstrap_perplexity_stderr(const std::vector<double>& x, int64_t iters) {
  if (x.size() < 2) return kNaN;
  const double n = static_cast<double>(x.size());
  std::vector<double> values;
  values.reserve(static_cast<size_t>(iters));
  for (int64_t chunk = 0; chunk < iters / 1000; ++chunk) {
    PyRandom rnd(static_cast<uint32_t>(chunk));
    for (int rep = 0; rep < 1000; ++rep) {
      double s = 0;  // rnd.choices(x, k=len(x)): x[floor(random() · n)]
      for (size_t k = 0; k < x.size(); ++k) s += x[static_cast<size_t>(std::floor(rnd.random() * n))];
      values.push_back(std::exp(-(s / n)));
    }
  }
  const double mu = mean(values);
  double ss = 0;
  for (double v : values) ss += (v - mu) * (v - mu);
  return std::sqrt(ss / static_cast<double>(values.size() - 1));
}

TaskResult score_task(const TaskSpec& task, const std::vector<Doc>& docs,
                      const std::vector<std::vector<Loglik>>& lls) {
  ATTNRES_CHECK(docs.size() == lls.size(), task.name);
  if (task.kind == TaskKind::kLoglikelihood) {
    std::vector<double> ll, greedy;
    for (const auto& l : lls) {
      ll.push_back(l[0].ll);
      greedy.push_back(l[0].greedy ? 1.0 : 0.0);
    }
    TaskResult r;
    r.task = task.name;
    r.n = static_cast<int64_t>(docs.size());
    r.metrics["perplexity"] = {std::exp(-mean(ll)), bootstrap_perplexity_stderr(ll)};
    r.metrics["acc"] = mean_metric(greedy);
    return r;
  }
  if (task.name != "mmlu") return multiple_choice(task, docs, lls);

  // mmlu: each subject is a task of its own; the group is their size-weighted
  // mean (= accuracy over all questions) with the pooled stderr.
  std::map<std::string, std::pair<std::vector<Doc>, std::vector<std::vector<Loglik>>>> by;
  for (size_t d = 0; d < docs.size(); ++d) {
    by[docs[d].subject].first.push_back(docs[d]);
    by[docs[d].subject].second.push_back(lls[d]);
  }
  TaskResult g;
  g.task = task.name;
  double sum = 0, pooled = 0;
  bool stderr_exists = true;
  for (const auto& [subject, part] : by) {
    TaskResult s = multiple_choice(task, part.first, part.second);
    s.task = "mmlu_" + subject;
    const Metric& a = s.metrics["acc"];
    sum += a.value * static_cast<double>(s.n);
    pooled += static_cast<double>(s.n - 1) * a.stderr_ * a.stderr_ * static_cast<double>(s.n);
    stderr_exists = stderr_exists && !std::isnan(a.stderr_);
    g.n += s.n;
    g.subjects[s.task] = s;
  }
  const double N = static_cast<double>(g.n), k = static_cast<double>(g.subjects.size());
  g.metrics["acc"] = {sum / N, stderr_exists && N > k ? std::sqrt(pooled / (N - k) / N) : kNaN};
  return g;
}

}  // namespace attnres

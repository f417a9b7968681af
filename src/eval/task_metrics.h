// task_metrics.h — the harness's metrics over scored documents, with its
// standard errors.
//
//   acc        argmax_i ll_i == gold (ties: the first index, as np.argmax)
//   acc_norm   argmax_i ll_i / len(choice_i) == gold (len in code points)
//   perplexity exp(−mean_d ll_d) over documents (lambada; not per token)
//   acc        (lambada) the continuation is the greedy one
// stderr of a mean: the sample standard deviation (n − 1) over √n; of the
// perplexity: the harness's bootstrap (100 chunks of 1000 resamples, chunk i
// drawn with CPython's random.Random(i), so the figure is the harness's to the
// last digit); of mmlu over its subjects: the size-weighted mean and the
// pooled stderr  √( Σ (n_i − 1) n_i se_i² / (Σ n_i − k) / Σ n_i ).
// A stderr that does not exist (one document) is NaN ("N/A" in the output).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "eval/loglik.h"
#include "eval/tasks.h"

namespace attnres {

struct Metric {
  double value = 0, stderr_ = 0;
};

struct TaskResult {
  std::string task;
  std::map<std::string, Metric> metrics;  // "acc", "acc_norm", "perplexity"
  int64_t n = 0;
  std::map<std::string, TaskResult> subjects;  // mmlu: per subject ("mmlu_<subject>")
};

// `lls` holds, per document in order, one Loglik per request.
TaskResult score_task(const TaskSpec& task, const std::vector<Doc>& docs, const std::vector<std::vector<Loglik>>& lls);

double mean_stderr(const std::vector<double>& x);  // sample sd / √n; NaN for n < 2
// The harness's bootstrap of exp(−mean(x)): `iters` resamples (a multiple of 1000).
double bootstrap_perplexity_stderr(const std::vector<double>& x, int64_t iters = 100000);

// CPython's random.Random(seed) (MT19937, seeded by init_by_array on all of
// the seed's 32-bit words) and its random(): 53-bit doubles in [0, 1).
class PyRandom {
 public:
  explicit PyRandom(uint64_t seed);
  double random();
  uint32_t getrandbits(int k);  // k in 1..32
  int64_t randbelow(int64_t n);  // Random._randbelow: getrandbits(n.bit_length()) until below n
  // Random.sample(range(n), k): k distinct indices, in CPython's order.
  std::vector<int64_t> sample(int64_t n, int64_t k);

 private:
  std::array<uint32_t, 624> mt_;
  int i_ = 624;
  uint32_t next();
};

}  // namespace attnres

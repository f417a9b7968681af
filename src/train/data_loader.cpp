// data_loader.cpp — see data_loader.h.
#include "train/data_loader.h"

#include <glob.h>

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace attnres {

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (out.empty()) {
    if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};  // TokenFile names the error
    fail(pattern, ": no files match");
  }
  std::sort(out.begin(), out.end());
  return out;
}

nlohmann::json data_fingerprint(const std::string& pattern) {
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& path : expand_glob(pattern)) {
    const TokenFile f(path);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(f.fingerprint()));
    shards.push_back({{"tokens", f.size()}, {"fingerprint", hex}});
  }
  return shards;
}

DataOrder parse_data_order(const std::string& s) {
  if (s == "random") return DataOrder::kRandom;
  if (s == "sequential") return DataOrder::kSequential;
  fail("data order must be 'random' or 'sequential', got '", s, "'");
}

DataLoader::DataLoader(const std::string& pattern, int64_t B, int64_t T, int64_t vocab_size, DataOrder order,
                       Rng* rng, int64_t group, int64_t tokenizer_vocab, const std::string& tokenizer)
    : B_(B), T_(T), order_(order), rng_(rng), group_(group), window_(static_cast<size_t>(batch_tokens(B, T) + 1)) {
  ATTNRES_CHECK(order != DataOrder::kRandom || rng != nullptr, "random order needs an Rng");
  ATTNRES_CHECK(group >= 1, "a step has at least one micro-batch");
  // Sequential reads need one step's micro-batches per shard; random windows one window.
  const int64_t need = order == DataOrder::kSequential ? checked_mul(group, B * T, "a step's tokens") + 1 : T + 1;
  const char* unit = order == DataOrder::kSequential ? (group > 1 ? "one step's micro-batches" : "one micro-batch")
                                                     : "one window";
  const std::vector<std::string> paths = expand_glob(pattern);
  for (const auto& path : paths) {
    TokenFile f(path);
    // One pass over the ids, against the stricter bound (an id past the
    // model's rows is past a smaller tokenizer's too).
    if (tokenizer_vocab > 0 && tokenizer_vocab < vocab_size)
      f.check_vocab(tokenizer_vocab, tokenizer);
    else
      f.check_vocab(vocab_size);
    // A shard too short to read from (prepare's last shard may be a few
    // tokens; an empty one none) is left out with a note: the data prepare
    // writes always trains.
    if (static_cast<int64_t>(f.size()) < need) {
      skipped_.push_back(cat(path, " (", f.size(), " tokens, fewer than ", unit, " needs: ", need, ")"));
      continue;
    }
    shards_.push_back(std::move(f));
  }
  if (shards_.empty())
    fail(paths.size() == 1 ? paths[0] : cat(pattern, ": every one of its ", paths.size(), " shards"), " holds fewer tokens than ",
         unit, " needs (", need, "): ", skipped_.front(), "; use a smaller --batch or --seq-len, or more data");
  int64_t total = 0;
  for (const auto& f : shards_) {
    total += static_cast<int64_t>(f.size()) - T;  // starts s with s + T < size
    starts_.push_back(total);
  }
}

int64_t DataLoader::total_tokens() const {
  int64_t n = 0;
  for (const auto& s : shards_) n += static_cast<int64_t>(s.size());
  return n;
}

void DataLoader::set_position(const LoaderPosition& p) {
  if (p.shard < 0 || p.shard >= static_cast<int64_t>(shards_.size()) || p.offset < 0 ||
      p.offset + group_ * B_ * T_ + 1 > static_cast<int64_t>(shards_[p.shard].size()))
    fail("data position (shard ", p.shard, ", offset ", p.offset, ") does not fit the training data");
  pos_ = p;
  in_group_ = 0;
}

void DataLoader::next_random(int32_t* inputs, int32_t* targets) {
  for (int64_t b = 0; b < B_; ++b) {
    const int64_t g = static_cast<int64_t>(rng_->below(static_cast<uint64_t>(starts_.back())));
    if (!inputs) continue;  // skip(): the draw only
    const size_t shard = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), g) - starts_.begin());
    const int64_t start = g - (shard ? starts_[shard - 1] : 0);
    shards_[shard].read(static_cast<size_t>(start), {window_.data(), static_cast<size_t>(T_ + 1)});
    for (int64_t t = 0; t < T_; ++t) {
      inputs[b * T_ + t] = window_[t];
      targets[b * T_ + t] = window_[t + 1];
    }
  }
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
  if (order_ == DataOrder::kRandom) return next_random(inputs, targets);
  const TokenFile& f = shards_[pos_.shard];
  if (inputs) {
    f.read(static_cast<size_t>(pos_.offset), window_);
    for (int64_t i = 0; i < B_ * T_; ++i) {
      inputs[i] = window_[i];
      targets[i] = window_[i + 1];
    }
  }
  // Advance by B·T so consecutive micro-batches share one boundary token,
  // as llm.c does; after a step's last micro-batch, move to the next shard
  // when the next step's would not fit.
  pos_.offset += B_ * T_;
  if (++in_group_ < group_) return;
  in_group_ = 0;
  if (pos_.offset + group_ * B_ * T_ + 1 > static_cast<int64_t>(f.size())) {
    pos_.offset = 0;
    if (++pos_.shard == static_cast<int64_t>(shards_.size())) {
      pos_.shard = 0;
      ++pos_.epoch;
    }
  }
}

}  // namespace attnres

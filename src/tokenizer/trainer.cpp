// trainer.cpp — see trainer.h.
#include "tokenizer/trainer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace attnres {

std::string to_tokenizer_json(const BpeModel& m) {
  using ojson = nlohmann::ordered_json;
  const ojson byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  ojson added = ojson::array();
  for (size_t i = 0; i < m.special_tokens.size(); ++i)
    added.push_back({{"id", m.tokens.size() + i},
                     {"content", m.special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  ojson vocab = ojson::object();
  std::unordered_map<std::string, size_t> seen;
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    if (!seen.emplace(m.tokens[id], id).second) fail("to_tokenizer_json: token ", id, " duplicates another token");
    vocab[bytes_to_byte_level(m.tokens[id])] = id;
  }
  ojson merges = ojson::array();
  for (const auto& [a, b] : m.merges)
    merges.push_back({bytes_to_byte_level(m.tokens.at(a)), bytes_to_byte_level(m.tokens.at(b))});
  ojson j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", m.nfc ? ojson{{"type", "NFC"}} : ojson(nullptr)},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", m.pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          byte_level}}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
  return j.dump(1) + "\n";
}

WordCounter::WordCounter(const PreTokenizer& pre) : pre_(&pre), scratch_(pre.make_scratch()), counts_(1 << 16) {}
WordCounter::~WordCounter() = default;
WordCounter::WordCounter(WordCounter&&) noexcept = default;

void WordCounter::add(std::string_view text) {
  pre_->split(text, *scratch_, pieces_);
  for (std::string_view p : pieces_) ++counts_.at_or_insert(p);
  total_ += pieces_.size();
}

void WordCounter::merge_from(WordCounter& other) {
  other.counts_.for_each([&](std::string_view w, uint64_t& c) { counts_.at_or_insert(w) += c; });
  total_ += other.total_;
  other.counts_.clear();
  other.total_ = 0;
}

namespace {

struct Candidate {
  int64_t count;
  uint64_t pair;
  // Max-heap order: larger count first, then the smaller pair.
  bool operator<(const Candidate& o) const { return count != o.count ? count < o.count : pair > o.pair; }
};

}  // namespace

BpeModel train_bpe(BytesMap<uint64_t>& word_counts, const BpeTrainerOptions& opt,
                   const std::function<void(size_t, size_t)>& progress) {
  BpeModel m;
  m.special_tokens = opt.special_tokens;
  m.pattern = opt.pattern;
  m.nfc = opt.nfc;
  if (opt.vocab_size < 256 + opt.special_tokens.size())
    fail("tokenizer vocabulary size ", opt.vocab_size, " is below 256 bytes + ", opt.special_tokens.size(),
         " special tokens");
  for (int b = 0; b < 256; ++b) m.tokens.emplace_back(1, char(b));
  const size_t target = opt.vocab_size - opt.special_tokens.size();
  std::unordered_map<std::string, uint32_t> id_of;
  for (uint32_t b = 0; b < 256; ++b) id_of.emplace(m.tokens[b], b);

  // Words as symbol runs in one array: word w is sym[begin[w], begin[w]+len[w]),
  // shrinking in place as pairs merge.
  std::vector<uint32_t> sym, begin, len;
  std::vector<int64_t> count;
  begin.reserve(word_counts.size());
  word_counts.for_each([&](std::string_view w, uint64_t& c) {
    if (w.size() < 2) return;  // no pairs
    begin.push_back(uint32_t(sym.size()));
    len.push_back(uint32_t(w.size()));
    count.push_back(int64_t(c));
    for (unsigned char ch : w) sym.push_back(ch);
  });
  word_counts.clear();
  if (sym.size() > UINT32_MAX) fail("tokenizer training corpus has too many distinct words");

  // Pair statistics: count per pair, and the words where each pair occurs
  // (with stale entries, skipped when scanned).
  PairMap pair_count(1 << 16), where_index(1 << 16);
  std::vector<std::vector<uint32_t>> where;
  auto add_count = [&](uint64_t p, int64_t d) {
    uint64_t& c = pair_count.at_or_insert(p, 0);
    c = uint64_t(int64_t(c) + d);
  };
  auto note_word = [&](uint64_t p, uint32_t w) {
    uint64_t& idx = where_index.at_or_insert(p, ~0ULL);
    if (idx == ~0ULL) {
      idx = where.size();
      where.emplace_back();
    }
    auto& list = where[idx];
    if (list.empty() || list.back() != w) list.push_back(w);
  };
  for (uint32_t w = 0; w < begin.size(); ++w) {
    const uint32_t* s = &sym[begin[w]];
    for (uint32_t i = 0; i + 1 < len[w]; ++i) {
      const uint64_t p = pair_key(s[i], s[i + 1]);
      add_count(p, count[w]);
      note_word(p, w);
    }
  }
  std::priority_queue<Candidate> heap;
  pair_count.for_each([&](uint64_t p, uint64_t& c) { heap.push({int64_t(c), p}); });

  std::vector<uint64_t> grown;  // pairs whose count rose during one merge
  const size_t wanted = target > 256 ? target - 256 : 0;
  while (m.tokens.size() < target && !heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const uint64_t* cur = pair_count.find(top.pair);
    const int64_t now = cur ? int64_t(*cur) : 0;
    if (now != top.count) {  // stale entry
      if (now > 0) heap.push({now, top.pair});
      continue;
    }
    if (top.count < int64_t(opt.min_frequency)) break;
    const uint32_t a = uint32_t(top.pair >> 32), b = uint32_t(top.pair);
    std::string bytes = m.tokens[a] + m.tokens[b];
    uint32_t nid;
    if (auto it = id_of.find(bytes); it != id_of.end()) {
      nid = it->second;  // the same bytes reached by another merge order
    } else {
      nid = uint32_t(m.tokens.size());
      id_of.emplace(bytes, nid);
      m.tokens.push_back(std::move(bytes));
    }
    m.merges.emplace_back(a, b);

    std::vector<uint32_t> words;
    if (uint64_t* idx = where_index.find(top.pair)) words.swap(where[*idx]);
    grown.clear();
    for (uint32_t w : words) {
      uint32_t* s = &sym[begin[w]];
      const uint32_t n = len[w];
      const int64_t c = count[w];
      uint32_t i = 0, j = 0;  // read and write positions
      bool any = false;
      while (i < n) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
          any = true;
          add_count(top.pair, -c);
          if (j > 0) {  // left neighbour: already rewritten
            add_count(pair_key(s[j - 1], a), -c);
            add_count(pair_key(s[j - 1], nid), c);
            grown.push_back(pair_key(s[j - 1], nid));
            note_word(pair_key(s[j - 1], nid), w);
          }
          if (i + 2 < n) {  // right neighbour: not yet rewritten
            add_count(pair_key(b, s[i + 2]), -c);
            add_count(pair_key(nid, s[i + 2]), c);
            grown.push_back(pair_key(nid, s[i + 2]));
            note_word(pair_key(nid, s[i + 2]), w);
          }
          s[j++] = nid;
          i += 2;
        } else {
          s[j++] = s[i++];
        }
      }
      if (any) len[w] = j;
    }
    std::sort(grown.begin(), grown.end());
    grown.erase(std::unique(grown.begin(), grown.end()), grown.end());
    for (uint64_t p : grown)
      if (const uint64_t* c = pair_count.find(p); c && int64_t(*c) > 0) heap.push({int64_t(*c), p});
    if (progress && (m.merges.size() % 256 == 0)) progress(m.tokens.size() - 256, wanted);
  }
  if (progress) progress(m.tokens.size() - 256, wanted);
  return m;
}

}  // namespace attnres

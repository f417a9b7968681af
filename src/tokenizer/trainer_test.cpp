// trainer_test.cpp — the BPE trainer against a from-the-definition trainer that
// recounts every pair at every step (same merges, same order, same ties), and
// the written tokenizer.json loading back into Tokenizer.
#include "tokenizer/trainer.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace attnres {
namespace {

// The definition: recount all pairs each step; merge the most frequent pair
// (ties: smaller (a, b) ids) everywhere, left to right.
std::vector<std::pair<uint32_t, uint32_t>> reference_merges(const std::map<std::string, uint64_t>& words,
                                                            size_t target_tokens, uint64_t min_frequency) {
  std::vector<std::string> tokens;
  std::map<std::string, uint32_t> id;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, char(b));
    id[tokens.back()] = uint32_t(b);
  }
  std::vector<std::pair<std::vector<uint32_t>, uint64_t>> segs;
  for (const auto& [w, c] : words) {
    std::vector<uint32_t> s;
    for (unsigned char ch : w) s.push_back(ch);
    segs.emplace_back(s, c);
  }
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  while (tokens.size() < target_tokens) {
    std::map<std::pair<uint32_t, uint32_t>, uint64_t> counts;
    for (const auto& [s, c] : segs)
      for (size_t i = 0; i + 1 < s.size(); ++i) counts[{s[i], s[i + 1]}] += c;
    std::pair<uint32_t, uint32_t> best{};
    uint64_t best_count = 0;
    for (const auto& [p, c] : counts)  // map order: the smaller pair wins ties
      if (c > best_count) {
        best = p;
        best_count = c;
      }
    if (best_count < std::max<uint64_t>(min_frequency, 1)) break;
    const std::string bytes = tokens[best.first] + tokens[best.second];
    uint32_t nid;
    if (id.count(bytes)) {
      nid = id[bytes];
    } else {
      nid = uint32_t(tokens.size());
      id[bytes] = nid;
      tokens.push_back(bytes);
    }
    merges.push_back(best);
    for (auto& [s, c] : segs) {
      std::vector<uint32_t> out;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == best.first && s[i + 1] == best.second) {
          out.push_back(nid);
          i += 2;
        } else {
          out.push_back(s[i++]);
        }
      }
      s = out;
    }
  }
  return merges;
}

TEST(BpeTrainer, MatchesDefinition) {
  std::mt19937 rng(11);
  const std::vector<std::string> syll = {"a", "b", "ab", "ba", "aa", "c", "the", "he", "e", " ", "  ", "\n", "x"};
  for (int trial = 0; trial < 5; ++trial) {
    std::map<std::string, uint64_t> words;
    BytesMap<uint64_t> counts;
    for (int w = 0; w < 300; ++w) {
      std::string s;
      const int n = 1 + int(rng() % 8);
      for (int k = 0; k < n; ++k) s += syll[rng() % syll.size()];
      const uint64_t c = 1 + rng() % 20;
      words[s] += c;
      counts.at_or_insert(s) += c;
    }
    BpeTrainerOptions opt;
    opt.vocab_size = 256 + 60 + 1;
    const BpeModel m = train_bpe(counts, opt);
    const auto want = reference_merges(words, 256 + 60, 2);
    EXPECT_EQ(m.merges, want) << "trial " << trial;
    EXPECT_LE(m.vocab_size(), opt.vocab_size);
  }
}

TEST(BpeTrainer, WritesALoadableTokenizer) {
  const std::string corpus =
      "The theory of the thermal theme: then there, the other theatre. "
      "Numbers 123 4567 and code x = f(y) + 1;\n\nthe end the end the end\n";
  const PreTokenizer pre({kQwen2Pattern}, true);
  WordCounter wc(pre);
  for (int i = 0; i < 20; ++i) wc.add(corpus);
  BpeTrainerOptions opt;
  opt.vocab_size = 300;
  const BpeModel m = train_bpe(wc.counts(), opt);
  EXPECT_EQ(m.vocab_size(), 300u);
  EXPECT_EQ(m.tokens.size(), 299u);
  const std::string json = to_tokenizer_json(m);
  const auto j = nlohmann::json::parse(json);
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["merges"].size(), m.merges.size());
  EXPECT_EQ(j["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(j["added_tokens"][0]["id"], 299);
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], kQwen2Pattern);

  const Tokenizer tok = Tokenizer::from_json(json);
  EXPECT_EQ(tok.vocab_size(), 300u);
  EXPECT_EQ(tok.eos_id(), 299u);
  const auto ids = tok.encode(corpus);
  EXPECT_EQ(tok.decode(ids), corpus);
  EXPECT_LT(ids.size(), corpus.size() / 2);  // it learned something
  EXPECT_EQ(tok.encode(" the").size(), 1u);
  const std::string odd = "\xff\xfe unseen 😀 text <|endoftext|>";
  EXPECT_EQ(tok.decode(tok.encode(odd)), odd);
}

TEST(BpeTrainer, StopsWhenPairsRunOut) {
  BytesMap<uint64_t> counts;
  counts.at_or_insert("abc") = 5;
  BpeTrainerOptions opt;
  opt.vocab_size = 1000;
  const BpeModel m = train_bpe(counts, opt);
  EXPECT_EQ(m.merges.size(), 2u);  // ab, abc
  EXPECT_EQ(m.vocab_size(), 256u + 2 + 1);
}

TEST(BpeTrainer, RejectsTinyVocabulary) {
  BytesMap<uint64_t> counts;
  BpeTrainerOptions opt;
  opt.vocab_size = 100;
  EXPECT_THROW(train_bpe(counts, opt), Error);
}

}  // namespace
}  // namespace attnres

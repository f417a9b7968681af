// tokenizer.cpp — see tokenizer.h.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"
#include "core/file_util.h"
#include "tokenizer/utf8.h"

namespace attnres {

namespace {

using json = nlohmann::json;

constexpr uint32_t kDead = ~0U;
constexpr uint64_t kNoMerge = ~0ULL;
constexpr size_t kNaiveMaxBytes = 64;  // longer pieces use the heap BPE
constexpr size_t kCacheMaxPieceBytes = 256;
constexpr size_t kCacheMaxEntries = 1 << 20;

// Inverse of byte_to_codepoint: code point -> byte, or -1.
int codepoint_to_byte(uint32_t cp) {
  static const std::vector<int16_t> table = [] {
    std::vector<int16_t> t(512, -1);
    for (int b = 0; b < 256; ++b) t[byte_to_codepoint(uint8_t(b))] = int16_t(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

// A vocab key in byte-level spelling -> raw bytes.
std::string byte_level_to_bytes(const std::string& s, const std::string& source) {
  std::string out;
  out.reserve(s.size());
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_char_len(u + i, s.size() - i);
    const int b = len ? codepoint_to_byte(utf8_decode(u + i, len)) : -1;
    if (b < 0) fail(source, ": token '", s, "' is not in the byte-level alphabet (only byte-level BPE is supported)");
    out += char(b);
    i += len;
  }
  return out;
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") ? j["type"].get<std::string>() : "";
}

bool normalizer_is_nfc(const json& n, const std::string& source) {
  if (n.is_null()) return false;
  const std::string t = type_of(n);
  if (t == "NFC") return true;
  if (t == "Sequence") {
    bool nfc = false;
    for (const auto& x : n.at("normalizers")) nfc = normalizer_is_nfc(x, source) || nfc;
    return nfc;
  }
  fail(source, ": unsupported normalizer '", t, "' (supported: NFC, Sequence of NFC, null)");
}

std::string regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

void collect_pretokenizer(const json& p, const std::string& source, std::vector<std::string>& patterns,
                          bool& prefix_space) {
  if (p.is_null()) return;
  const std::string t = type_of(p);
  if (t == "Sequence") {
    for (const auto& x : p.at("pretokenizers")) collect_pretokenizer(x, source, patterns, prefix_space);
  } else if (t == "ByteLevel") {
    // HF puts the space before every piece that the pre-tokenizers before it
    // made; we put it only before each stretch between added tokens.
    if (p.value("add_prefix_space", false) && !patterns.empty())
      fail(source, ": ByteLevel with add_prefix_space after another pre-tokenizer is not supported");
    if (p.value("use_regex", true)) patterns.push_back(kGpt2Pattern);
    prefix_space = p.value("add_prefix_space", false);
  } else if (t == "Split") {
    const json& pat = p.at("pattern");
    if (p.value("behavior", std::string("Isolated")) != "Isolated" || p.value("invert", false))
      fail(source, ": unsupported Split pre-tokenizer (only behavior Isolated, invert false)");
    if (pat.contains("Regex"))
      patterns.push_back(pat["Regex"].get<std::string>());
    else
      patterns.push_back(regex_escape(pat.at("String").get<std::string>()));
  } else {
    fail(source, ": unsupported pre_tokenizer '", t, "' (supported: Split, ByteLevel, Sequence)");
  }
}

}  // namespace

EncodeState::EncodeState(const Tokenizer& tok) : scratch_(tok.pre_->make_scratch()) {}

Tokenizer Tokenizer::load(const std::string& path) {
  return from_json(read_file(path), path);
}

Tokenizer Tokenizer::load_for_model(const std::string& path, int64_t vocab_size, const std::string& config) {
  Tokenizer tok = load(path);
  if (static_cast<int64_t>(tok.vocab_size()) > vocab_size)
    fail(path, ": the tokenizer has ", tok.vocab_size(), " tokens, more than the model's vocab_size ", vocab_size,
         " (", config, "): they do not belong together");
  return tok;
}

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& source) {
  json j = parse_json(text, source);
  Tokenizer tok;
  try {
    const json& model = j.at("model");
    if (model.value("type", std::string("BPE")) != "BPE")
      fail(source, ": model type '", model["type"].get<std::string>(), "' is not supported (only BPE)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty())
        fail(source, ": BPE with ", key, " is not supported");
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
      fail(source, ": BPE dropout is not supported");
    tok.ignore_merges_ = model.value("ignore_merges", false);

    // Vocabulary: byte-level keys -> raw bytes per id.
    std::vector<std::string> bytes_of;
    // Ids are integers in [0, 2^24) (a vocabulary far beyond any real one; a
    // larger id would size the tables by it), one token each.
    auto id_of = [&](const json& v, const std::string& what) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= (int64_t{1} << 24))
        fail(source, ": ", what, " has id ", brief(v), ", not an integer in [0, 2^24)");
      return v.get<uint32_t>();
    };
    auto put = [&](uint32_t id, std::string bytes) {
      if (id >= bytes_of.size()) bytes_of.resize(size_t(id) + 1);
      if (!bytes_of[id].empty() && bytes_of[id] != bytes)
        fail(source, ": id ", id, " is given to two different tokens");
      tok.id_of_[bytes] = id;
      bytes_of[id] = std::move(bytes);
    };
    for (const auto& [key, id] : model.at("vocab").items())
      put(id_of(id, "vocabulary token"), byte_level_to_bytes(key, source));
    for (int b = 0; b < 256; ++b) {
      auto it = tok.id_of_.find(std::string(1, char(b)));
      if (it == tok.id_of_.end())
        fail(source, ": vocabulary has no token for byte ", b, " (byte-level BPE needs all 256)");
      tok.byte_id_[b] = it->second;
    }

    // Merges: "a b" strings or [a, b] lists, in rank order.
    const json& merges = model.at("merges");
    tok.merges_.reserve(merges.size());
    uint32_t rank = 0;
    for (const auto& m : merges) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) fail(source, ": merge ", rank, " '", s, "' is not 'a b'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        if (!m.is_array() || m.size() != 2) fail(source, ": merge ", rank, " is neither 'a b' nor [a, b]");
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      }
      const std::string ab = byte_level_to_bytes(a, source), bb = byte_level_to_bytes(b, source);
      auto ia = tok.id_of_.find(ab), ib = tok.id_of_.find(bb), im = tok.id_of_.find(ab + bb);
      if (ia == tok.id_of_.end() || ib == tok.id_of_.end() || im == tok.id_of_.end())
        fail(source, ": merge ", rank, " (", a, " ", b, ") uses a token missing from the vocabulary");
      uint64_t& v = tok.merges_.at_or_insert(pair_key(ia->second, ib->second), kNoMerge);
      if (v == kNoMerge) v = (uint64_t(rank) << 32) | im->second;
      ++rank;
    }

    // Added tokens: raw content, matched before normalization.
    if (j.contains("added_tokens"))
      for (const auto& a : j["added_tokens"]) {
        AddedToken t;
        t.content = a.at("content").get<std::string>();
        t.id = id_of(a.at("id"), "added token");
        t.special = a.value("special", false);
        t.lstrip = a.value("lstrip", false);
        t.rstrip = a.value("rstrip", false);
        t.normalized = a.value("normalized", false);
        if (a.value("single_word", false))
          fail(source, ": added token '", t.content, "' has single_word = true, which is not supported");
        if (t.content.empty()) fail(source, ": added token ", t.id, " is empty");
        put(t.id, t.content);
        tok.added_.push_back(std::move(t));
      }

    // Normalizer, pre-tokenizer, decoder.
    const bool nfc = normalizer_is_nfc(j.value("normalizer", json()), source);
    std::vector<std::string> patterns;
    bool prefix_space = false;
    collect_pretokenizer(j.value("pre_tokenizer", json()), source, patterns, prefix_space);
    tok.cuttable_ = !prefix_space && !patterns.empty();
    for (const auto& p : patterns) tok.cuttable_ = tok.cuttable_ && (p == kQwen2Pattern || p == kGpt2Pattern);
    for (const auto& t : tok.added_) tok.cuttable_ = tok.cuttable_ && t.content.find('\n') == std::string::npos;
    // A cut before " word" holds unless an added token could reach across it:
    // one holding a space, or one that strips the white space to its right.
    tok.word_gaps_cuttable_ = tok.cuttable_;
    for (const auto& t : tok.added_)
      tok.word_gaps_cuttable_ = tok.word_gaps_cuttable_ && !t.rstrip && t.content.find(' ') == std::string::npos;
    try {
      tok.pre_ = std::make_unique<PreTokenizer>(std::move(patterns), nfc, prefix_space);
    } catch (const Error& e) {
      fail(source, ": ", e.what());
    }
    // The two kinds of added tokens, each longest first (so the first match
    // at a position is the longest); normalized ones as the normalizer makes
    // them (HF normalizes their content the same way).
    for (const AddedToken& t : tok.added_) {
      AddedTokenSet& set = t.normalized ? tok.norm_added_ : tok.raw_added_;
      set.tokens.push_back(t);
      if (t.normalized) {
        std::string& norm = set.tokens.back().content;
        norm.clear();
        tok.pre_->normalize_append(t.content, norm);
        // HF decodes such a token as its normalized text; its id stays
        // findable by either spelling.
        bytes_of[t.id] = norm;
        tok.id_of_.emplace(norm, t.id);
      }
      const unsigned char first = static_cast<unsigned char>(set.tokens.back().content[0]);
      set.first[first] = 1;
      // cut_point must not cut before a token with lstrip; a normalized one
      // that starts with a non-ASCII character may come from ASCII ("A" +
      // U+030A is "Å"), so there is then no safe place.
      if (t.lstrip) tok.lstrip_first_[first] = tok.lstrip_first_[static_cast<unsigned char>(t.content[0])] = 1;
      if (t.lstrip && t.normalized && first >= 0x80) tok.cuttable_ = false;
    }
    for (AddedTokenSet* set : {&tok.raw_added_, &tok.norm_added_})
      std::stable_sort(set->tokens.begin(), set->tokens.end(), [](const AddedToken& x, const AddedToken& y) {
        return x.content.size() > y.content.size();
      });

    tok.token_offset_.assign(1, 0);
    for (const auto& b : bytes_of) {
      tok.token_bytes_ += b;
      tok.token_offset_.push_back(static_cast<uint32_t>(tok.token_bytes_.size()));
    }
    const json dec = j.value("decoder", json());
    if (!dec.is_null() && type_of(dec) != "ByteLevel")
      fail(source, ": unsupported decoder '", type_of(dec), "' (only ByteLevel)");
  } catch (const json::exception& e) {
    fail(source, ": unexpected tokenizer.json structure: ", e.what());
  }
  return tok;
}

int64_t Tokenizer::token_id(std::string_view bytes) const {
  auto it = id_of_.find(std::string(bytes));
  return it == id_of_.end() ? -1 : int64_t(it->second);
}

std::string_view Tokenizer::token_bytes(uint32_t id) const {
  if (id >= vocab_size()) fail("token id ", id, " is out of range (vocabulary size ", vocab_size(), ")");
  return std::string_view(token_bytes_).substr(token_offset_[id], token_offset_[id + 1] - token_offset_[id]);
}

size_t Tokenizer::cut_point(std::string_view text, size_t at) const {
  if (!cuttable_) return text.size();
  return pretoken_cut(text, at, lstrip_first_, word_gaps_cuttable_);
}

uint32_t Tokenizer::eos_id() const {
  const int64_t id = token_id("<|endoftext|>");
  if (id < 0) fail("the tokenizer has no <|endoftext|> token");
  return uint32_t(id);
}

// BPE of one piece into st.sym_.  Naive form for short pieces: `val[i]` holds
// the merge of (sym[i], sym[i+1]) as (rank << 32 | merged id), so the minimum
// over val is the next merge (leftmost on ties: equal values mean equal pairs).
// Long pieces use a linked list and a min-heap of (rank << 32 | position), with
// stale entries skipped when popped; both orders merge identically.
void Tokenizer::bpe(std::string_view piece, EncodeState& st) const {
  const size_t n = piece.size();
  auto& sym = st.sym_;
  sym.resize(n);
  for (size_t i = 0; i < n; ++i) sym[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  if (n == 1) return;
  if (ignore_merges_) {
    if (auto it = id_of_.find(std::string(piece)); it != id_of_.end()) {
      sym.assign(1, it->second);
      return;
    }
  }
  auto merge_of = [&](uint32_t a, uint32_t b) {
    const uint64_t* v = merges_.find(pair_key(a, b));
    return v ? *v : kNoMerge;
  };

  if (n <= kNaiveMaxBytes) {
    uint64_t val[kNaiveMaxBytes];
    size_t m = n;
    for (size_t i = 0; i + 1 < m; ++i) val[i] = merge_of(sym[i], sym[i + 1]);
    while (m > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < m; ++i)
        if (val[i] < val[best]) best = i;
      if (val[best] == kNoMerge) break;
      sym[best] = static_cast<uint32_t>(val[best]);
      for (size_t i = best + 1; i + 1 < m; ++i) {
        sym[i] = sym[i + 1];
        val[i] = val[i + 1];
      }
      --m;
      if (best > 0) val[best - 1] = merge_of(sym[best - 1], sym[best]);
      if (best + 1 < m) val[best] = merge_of(sym[best], sym[best + 1]);
    }
    sym.resize(m);
    return;
  }

  auto& next = st.next_;
  auto& prev = st.prev_;
  auto& heap = st.heap_;
  next.resize(n);
  prev.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? uint32_t(i + 1) : kDead;
    prev[i] = i > 0 ? uint32_t(i - 1) : kDead;
  }
  auto push = [&](uint32_t pos) {
    if (pos == kDead || next[pos] == kDead) return;
    const uint64_t v = merge_of(sym[pos], sym[next[pos]]);
    if (v == kNoMerge) return;
    heap.push_back(((v >> 32) << 32) | pos);
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (size_t i = 0; i + 1 < n; ++i) push(uint32_t(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const uint32_t pos = uint32_t(top), rank = uint32_t(top >> 32);
    if (sym[pos] == kDead || next[pos] == kDead) continue;
    const uint64_t v = merge_of(sym[pos], sym[next[pos]]);
    if (v == kNoMerge || uint32_t(v >> 32) != rank) continue;  // stale
    const uint32_t gone = next[pos];
    sym[pos] = uint32_t(v);
    sym[gone] = kDead;
    next[pos] = next[gone];
    if (next[gone] != kDead) prev[next[gone]] = pos;
    push(prev[pos]);
    push(pos);
  }
  size_t m = 0;
  for (uint32_t i = 0; i != kDead; i = next[i]) sym[m++] = sym[i];
  sym.resize(m);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out, EncodeState& st) const {
  if (piece.size() > kCacheMaxPieceBytes) {
    bpe(piece, st);
    out.insert(out.end(), st.sym_.begin(), st.sym_.end());
    return;
  }
  const uint64_t h = hash_bytes(piece);
  size_t n = 0;
  if (const uint32_t* ids = st.cache_.find(piece, h, n)) {
    out.insert(out.end(), ids, ids + n);
    return;
  }
  bpe(piece, st);
  out.insert(out.end(), st.sym_.begin(), st.sym_.end());
  if (st.cache_.size() >= kCacheMaxEntries) st.cache_.clear();
  st.cache_.insert(piece, h, st.sym_.data(), st.sym_.size());
}

void Tokenizer::encode_text(std::string_view text, std::vector<uint32_t>& out, EncodeState& st) const {
  if (text.empty()) return;
  pre_->split(text, *st.scratch_, st.pieces_);
  for (std::string_view p : st.pieces_) encode_piece(p, out, st);
}

namespace {

// Length of the Unicode White_Space character (what HF's `\s` matches when an
// added token strips white space) that starts at / ends just before text[i],
// or 0.  Exact byte patterns, so invalid UTF-8 around them does not matter.
constexpr std::string_view kWideSpaces[] = {
    "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82",
    "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88",
    "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F",
    "\xE3\x80\x80"};

bool ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

size_t space_at(std::string_view text, size_t i) {
  if (i >= text.size()) return 0;
  if (ascii_space(text[i])) return 1;
  for (std::string_view w : kWideSpaces)
    if (text.substr(i, w.size()) == w) return w.size();
  return 0;
}

size_t space_before(std::string_view text, size_t i) {
  if (i == 0) return 0;
  if (ascii_space(text[i - 1])) return 1;
  for (std::string_view w : kWideSpaces)
    if (i >= w.size() && text.substr(i - w.size(), w.size()) == w) return w.size();
  return 0;
}

// Cuts `text` at the tokens of `set` (leftmost, then longest; lstrip/rstrip
// take the white space beside them, but not what an earlier token took):
// gap(stretch) for each stretch between them (empty ones too), the token's id
// appended to `out` for each token.
template <class Gap>
void split_at_added(std::string_view text, const AddedTokenSet& set, std::vector<uint32_t>& out, Gap&& gap) {
  size_t start = 0;  // first byte not yet handed on
  for (size_t p = 0; p < text.size(); ++p) {
    if (!set.first[static_cast<unsigned char>(text[p])]) continue;
    const AddedToken* hit = nullptr;
    for (const auto& t : set.tokens)
      if (text.compare(p, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    if (!hit) continue;
    size_t b = p, e = p + hit->content.size();
    if (hit->lstrip)
      for (size_t k; b > start && (k = space_before(text, b)) > 0 && b - k >= start;) b -= k;
    if (hit->rstrip)
      for (size_t k; (k = space_at(text, e)) > 0;) e += k;
    gap(text.substr(start, b - start));
    out.push_back(hit->id);
    start = e;
    p = e - 1;
  }
  gap(text.substr(start));
}

}  // namespace

// A stretch between raw-matched added tokens: normalized, cut at the
// normalized added tokens, and the rest encoded (its NFC again is the identity).
void Tokenizer::encode_between_raw_added(std::string_view text, std::vector<uint32_t>& out, EncodeState& st) const {
  if (norm_added_.tokens.empty() || text.empty()) {
    encode_text(text, out, st);
    return;
  }
  std::string& norm = st.normalized_;
  norm.clear();
  pre_->normalize_append(text, norm);
  split_at_added(norm, norm_added_, out, [&](std::string_view gap) { encode_text(gap, out, st); });
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out, EncodeState& st, bool match_added) const {
  if (!match_added || added_.empty()) {
    encode_text(text, out, st);
    return;
  }
  // As HF: tokens flagged "normalized": false are found in the raw text first,
  // then those flagged true in each normalized stretch between them.
  split_at_added(text, raw_added_, out,
                 [&](std::string_view gap) { encode_between_raw_added(gap, out, st); });
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  EncodeState st(*this);
  std::vector<uint32_t> out;
  encode(text, out, st);
  return out;
}

void Tokenizer::decode(std::span<const uint32_t> ids, std::string& out) const {
  for (uint32_t id : ids) {
    const std::string_view b = token_bytes(id);
    if (b.empty()) fail("token id ", id, " is not in the vocabulary");
    out.append(b);
  }
}

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string out;
  decode(ids, out);
  return out;
}

}  // namespace attnres

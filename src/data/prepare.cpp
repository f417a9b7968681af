// prepare.cpp — see prepare.h.
#include "data/prepare.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <span>

#include "core/error.h"
#include "core/file_util.h"
#include "io/token_file.h"
#include "tokenizer/hash_map.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace attnres {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string mb(uint64_t bytes) {
  return cat(std::fixed, std::setprecision(1), double(bytes) / 1e6, " MB");
}

int resolve_threads(int t) {
  return t > 0 ? t : std::max(1, omp_get_num_procs());
}

// A part cut into pieces of about `bytes` at token-preserving places; where
// none comes within `most` bytes (a run of one class: megabytes of letters,
// digits or punctuation with no space or newline between), at `most` anyway,
// on a UTF-8 character boundary.  Such a forced cut is the one place where the
// ids may differ from those of the whole document (HF tokenizers would merge
// across it); it bounds the BPE's work arrays (~24 bytes per byte of a piece)
// and so prepare's memory whatever the input.
struct Piece {
  size_t part;
  std::string_view text;
};
void cut_pieces(const std::vector<DocPart>& parts, size_t bytes, size_t most,
                const std::function<size_t(std::string_view, size_t)>& cut, std::vector<Piece>& out) {
  out.clear();
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string_view t = parts[i].text;
    size_t b = 0;
    while (b < t.size()) {
      size_t e = b + bytes >= t.size() ? t.size() : b + cut(t.substr(b, most + 1), bytes);
      if (e - b > most) e = utf8_char_start(t, b + most, b + 1);  // not inside a character, one byte at least
      out.push_back({i, t.substr(b, e - b)});
      b = e;
    }
  }
}

constexpr size_t kPieceBytes = 256 << 10;

// What the walk of the input directories left unread, said once on stderr.
void note_skipped(const CorpusReader& reader) {
  const std::vector<std::string>& s = reader.skipped();
  if (s.empty()) return;
  std::string shown;
  for (size_t i = 0; i < s.size() && i < 5; ++i) shown += cat(i ? ", " : "", s[i]);
  if (s.size() > 5) shown += cat(" and ", s.size() - 5, " more");
  std::fprintf(stderr, "note: skipped %zu input entr%s that %s not regular files: %s\n", s.size(),
               s.size() == 1 ? "y" : "ies", s.size() == 1 ? "is" : "are", shown.c_str());
}
constexpr size_t kMostPieceBytes = 4 * kPieceBytes;  // 1 MiB: 24 MiB of BPE work arrays per thread

// Writes one split as one file or as shards of about shard_tokens.
class SplitWriter {
 public:
  SplitWriter(std::string dir, std::string name, int version, uint64_t shard_tokens)
      : dir_(std::move(dir)), name_(std::move(name)), version_(version), shard_tokens_(shard_tokens) {}
  void append(std::span<const uint32_t> ids) {
    while (!ids.empty()) {
      if (!w_) open();
      const size_t n = shard_tokens_ > 0 ? std::min<size_t>(ids.size(), shard_tokens_ - w_->count()) : ids.size();
      w_->append(ids.first(n));
      ids = ids.subspan(n);
      if (shard_tokens_ > 0 && w_->count() >= shard_tokens_) close_shard();
    }
  }
  void close() {
    if (!w_ && files_.empty()) open();  // an empty split still gets its file
    close_shard();
  }
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::string dir_, name_;
  int version_;
  uint64_t shard_tokens_;
  std::unique_ptr<TokenFileWriter> w_;
  std::vector<std::string> files_;

  void open() {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "_%06zu", files_.size());
    const std::string path = dir_ + "/" + name_ + (shard_tokens_ > 0 ? suffix : "") + ".bin";
    w_ = std::make_unique<TokenFileWriter>(path, version_);
    files_.push_back(path);
  }
  void close_shard() {
    if (w_) w_->close();
    w_.reset();
  }
};

}  // namespace

// The names prepare gives its token files: train.bin, val.bin, train_000000.bin, …
bool is_token_file_name(const std::string& name) {
  for (const std::string split : {"train", "val"}) {
    if (name.rfind(split, 0) != 0) continue;
    const std::string rest = name.substr(split.size());
    if (rest == ".bin") return true;
    if (rest.size() == 11 && rest[0] == '_' && rest.compare(7, 4, ".bin") == 0 &&
        rest.find_first_not_of("0123456789", 1) == 7)
      return true;
  }
  return false;
}

void check_inputs_outside_outputs(const PrepareOptions& opt) {
  for (const std::string& in : opt.corpus.inputs) {
    const std::filesystem::path p(write_target(in));
    if (lies_within(in, opt.out_dir) && (is_token_file_name(p.filename().string()) ||
                                         p.filename() == "prepare.json" || p.filename() == "tokenizer.json"))
      fail("--input ", in, " is a file this prepare writes in --out ", opt.out_dir,
           ": outputs are never inputs; move the corpus or choose another --out");
  }
}

// Before a prepare writes into a directory that holds an earlier prepare's
// outputs, those are removed (prepare.json first, so that a prepare stopped
// half-way never leaves a manifest naming files that are gone or new), so
// that the directory, and the documented glob OUT/train_*.bin, end with
// exactly this prepare's shards.  Token files that no prepare.json there
// lists are not ours to delete: the directory is refused.
void clear_previous_prepare(const std::string& out_dir, bool remove) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return;
  std::set<std::string> listed;
  const std::string manifest = out_dir + "/prepare.json";
  const bool had_manifest = fs::exists(manifest, ec);
  if (had_manifest) {
    nlohmann::json m;
    try {
      m = nlohmann::json::parse(read_file(manifest));
      for (const char* split : {"train", "val"})
        for (const auto& f : m.at(split).at("files")) listed.insert(fs::path(f.get<std::string>()).filename().string());
    } catch (const nlohmann::json::exception&) {
      fail(manifest, ": not a prepare.json this version wrote (no train/val file lists); remove the directory's "
           "token files yourself or choose another --out");
    }
  }
  std::vector<fs::path> ours;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_token_file_name(name)) continue;
    if (!listed.count(name))
      fail("--out ", out_dir, " holds ", name, ", a token file that ",
           had_manifest ? "its prepare.json does not list" : "no prepare.json there lists",
           ": writing beside it would mix another corpus into OUT/train_*.bin; choose another --out or remove it");
    ours.push_back(e.path());
  }
  if (ec) fail(out_dir, ": cannot list the directory: ", ec.message());
  if (!remove) return;
  if (had_manifest && !fs::remove(manifest, ec)) fail(manifest, ": cannot remove: ", ec.message());
  for (const fs::path& f : ours)
    if (!fs::remove(f, ec)) fail(f.string(), ": cannot remove: ", ec.message());
}

void remove_dead_prepare_temporaries(const std::string& out_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(out_dir, ec)) return;
  remove_dead_temporaries(out_dir, [](const std::string& stem) {
    return is_token_file_name(stem) || stem == "prepare.json" || stem == "tokenizer.json";
  });
}

void check_bpe_flags(int64_t vocab_size, int64_t min_frequency, int64_t train_mb) {
  if (vocab_size < 257 || vocab_size > (int64_t{1} << 24))
    fail("--vocab-size must be from 257 (256 bytes + <|endoftext|>) to 2^24 = 16777216 (what a tokenizer.json may "
         "hold here), got ", vocab_size);
  if (min_frequency < 1) fail("--min-frequency must be at least 1, got ", min_frequency);
  if (train_mb < 0 || train_mb > (int64_t{1} << 40)) fail("--train-mb must be 0 (all) or up to 2^40, got ", train_mb);
}

bool is_val_document(uint64_t seed, uint64_t doc, double val_fraction) {
  if (val_fraction <= 0) return false;
  if (val_fraction >= 1) return true;
  const uint64_t h = mix64(mix64(seed) ^ (doc * 0x9e3779b97f4a7c15ULL));
  return double(h >> 11) * 0x1.0p-53 < val_fraction;
}

PrepareSummary prepare_corpus(const PrepareOptions& opt) {
  const double t0 = now_s();
  const Tokenizer tok = Tokenizer::load(opt.tokenizer);
  const uint32_t eos = tok.eos_id();
  const int version = tok.vocab_size() <= 65536 ? 1 : 2;
  const int threads = resolve_threads(opt.threads);
  if (opt.val_fraction < 0 || opt.val_fraction >= 1) fail("--val-fraction must be in [0, 1), got ", opt.val_fraction);

  CorpusOptions copt = opt.corpus;
  copt.cut = [&tok](std::string_view t, size_t at) { return tok.cut_point(t, at); };
  CorpusReader reader(copt);
  note_skipped(reader);
  check_inputs_outside_outputs(opt);
  clear_previous_prepare(opt.out_dir, /*remove=*/true);
  remove_dead_prepare_temporaries(opt.out_dir);
  std::error_code ec;
  std::filesystem::create_directories(opt.out_dir, ec);
  if (ec) fail(opt.out_dir, ": cannot create directory: ", ec.message());

  SplitWriter writers[2] = {SplitWriter(opt.out_dir, "train", version, opt.shard_tokens),
                            SplitWriter(opt.out_dir, "val", version, opt.shard_tokens)};
  std::vector<std::unique_ptr<EncodeState>> states;
  for (int i = 0; i < threads; ++i) states.push_back(std::make_unique<EncodeState>(tok));

  PrepareSummary sum;
  Progress progress(opt.log, "prepare", reader.total_file_bytes());
  std::vector<DocPart> parts;
  std::vector<Piece> pieces;
  std::vector<std::vector<uint32_t>> ids;
  while (true) {
    parts.clear();
    if (!reader.next_batch(opt.batch_bytes, parts)) break;
    cut_pieces(parts, kPieceBytes, kMostPieceBytes, copt.cut, pieces);
    if (ids.size() < pieces.size()) ids.resize(pieces.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t i = 0; i < pieces.size(); ++i) {
      ids[i].clear();
      tok.encode(pieces[i].text, ids[i], *states[omp_get_thread_num()], /*match_added=*/false);
    }
    size_t pi = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      const int split = is_val_document(opt.seed, parts[p].doc, opt.val_fraction) ? 1 : 0;
      if (parts[p].first) {
        writers[split].append(std::span<const uint32_t>(&eos, 1));
        ++sum.documents[split];
        ++sum.tokens[split];
      }
      for (; pi < pieces.size() && pieces[pi].part == p; ++pi) {
        writers[split].append(ids[pi]);
        sum.tokens[split] += ids[pi].size();
      }
    }
    progress.update(reader.consumed_file_bytes(), cat(mb(reader.text_bytes()), ", ", reader.documents(), " docs, ",
                                                      sum.tokens[0] + sum.tokens[1], " tokens"));
  }
  if (sum.documents[0] + sum.documents[1] == 0)
    fail("the corpus has no documents (", reader.files().size(), " files, all empty?)");
  if (opt.val_fraction > 0 && sum.documents[1] == 0)
    fail("no document fell to val (", sum.documents[0], " documents, --val-fraction ", opt.val_fraction,
         "): raise --val-fraction or split the text into more documents (--doc-split-kb)");
  for (auto& w : writers) w.close();
  sum.files[0] = writers[0].files();
  sum.files[1] = writers[1].files();
  sum.text_bytes = reader.text_bytes();
  sum.seconds = now_s() - t0;

  nlohmann::ordered_json manifest = {
      {"tokenizer", opt.tokenizer},
      {"vocab_size", tok.vocab_size()},
      {"eos_id", eos},
      {"token_file_version", version},
      {"val_fraction", opt.val_fraction},
      {"seed", opt.seed},
      {"inputs", opt.corpus.inputs},
      {"input_files", reader.files().size()},
      {"text_bytes", sum.text_bytes},
      {"train", {{"documents", sum.documents[0]}, {"tokens", sum.tokens[0]}, {"files", sum.files[0]}}},
      {"val", {{"documents", sum.documents[1]}, {"tokens", sum.tokens[1]}, {"files", sum.files[1]}}},
      {"seconds", sum.seconds},
  };
  // The shards carry the tokenizer that made them (train copies it into its checkpoints).
  const std::string beside = opt.out_dir + "/tokenizer.json";
  std::error_code same_ec;
  if (!std::filesystem::equivalent(opt.tokenizer, beside, same_ec)) write_file_atomic(beside, read_file(opt.tokenizer));
  manifest["tokenizer_copy"] = beside;
  write_file_atomic(opt.out_dir + "/prepare.json", manifest.dump(2) + "\n");
  const uint64_t toks = sum.tokens[0] + sum.tokens[1];
  progress.finish(cat(
      reader.files().size(), reader.files().size() == 1 ? " file, " : " files, ", sum.documents[0] + sum.documents[1],
      " documents (train ", sum.documents[0], ", val ", sum.documents[1], "), ", toks, " tokens (train ", sum.tokens[0],
      ", val ", sum.tokens[1], "), ", mb(sum.text_bytes), " of text, ", std::fixed, std::setprecision(1),
      double(sum.text_bytes) / 1e6 / sum.seconds, " MB/s, ", std::setprecision(2),
      double(sum.text_bytes) / double(std::max<uint64_t>(toks, 1)), " bytes/token, ", threads, " threads"));
  return sum;
}

BpeModel train_tokenizer_on_corpus(const CorpusOptions& corpus, const BpeTrainerOptions& opt, int threads,
                                   uint64_t max_bytes, FILE* log) {
  threads = resolve_threads(threads);
  CorpusOptions copt = corpus;
  copt.cut = line_cut;
  CorpusReader reader(copt);
  note_skipped(reader);
  const PreTokenizer pre({opt.pattern}, opt.nfc);
  std::vector<WordCounter> counters;
  for (int i = 0; i < threads; ++i) counters.emplace_back(pre);
  Progress count_progress(
      log, "tokenizer: counting words",
      max_bytes ? std::min<uint64_t>(max_bytes, reader.total_file_bytes()) : reader.total_file_bytes());
  std::vector<DocPart> parts;
  std::vector<Piece> pieces;
  while (!max_bytes || reader.text_bytes() < max_bytes) {
    parts.clear();
    if (!reader.next_batch(4 << 20, parts)) break;
    cut_pieces(parts, kPieceBytes, kMostPieceBytes, copt.cut, pieces);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t i = 0; i < pieces.size(); ++i) counters[omp_get_thread_num()].add(pieces[i].text);
    count_progress.update(max_bytes ? reader.text_bytes() : reader.consumed_file_bytes(),
                          cat(mb(reader.text_bytes()), ", ", reader.documents(), " docs"));
  }
  for (int i = 1; i < threads; ++i) counters[0].merge_from(counters[i]);
  if (counters[0].total_words() == 0) fail("tokenizer training corpus is empty");
  count_progress.finish(cat(mb(reader.text_bytes()), ", ", counters[0].total_words(), " words, ",
                            counters[0].unique_words(), " distinct"));

  const size_t reserved = 256 + opt.special_tokens.size();
  Progress merge_progress(log, "tokenizer: merging", opt.vocab_size > reserved ? opt.vocab_size - reserved : 1);
  BpeModel m = train_bpe(counters[0].counts(), opt, [&](size_t done, size_t wanted) {
    merge_progress.update(done, cat(done, "/", wanted, " tokens"));
  });
  merge_progress.finish(cat(m.merges.size(), " merges, vocabulary ", m.vocab_size()));
  return m;
}

}  // namespace attnres

// corpus.h — reads a corpus as a stream of documents, in bounded memory.
//
// Inputs are files and directories (walked recursively, in sorted path order,
// skipping names that start with '.').  Each file is read through zlib, so
// gzip (detected by its magic bytes, not its name) and plain files read alike.
// A file is either
//   text  — the whole file is one document (bytes as they are, UTF-8 or not),
//           or, with split_bytes > 0, several documents cut at blank lines
//           once a document has reached split_bytes;
//   JSONL — one JSON object per line, the document is its "text" string;
//           blank lines are skipped; anything else, or a line longer than
//           max_part_bytes, is an Error naming the file and line.
// Format "auto" picks JSONL for names ending .jsonl / .ndjson (optionally .gz).
//
// Documents arrive in parts of about part_bytes: a long document is cut only
// where `cut(text, at)` allows (the tokenizer's token-preserving cut points),
// so a corpus of any size streams.  This is not a tokenizer or a shard writer:
// see data/prepare.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace attnres {

// Just after a '\n' followed by a printable ASCII byte, at or after `at`
// (text.size() if none): the token-preserving cut of Tokenizer::cut_point for
// the Qwen2 and GPT-2 regexes, usable before a tokenizer exists.
size_t line_cut(std::string_view text, size_t at);

// "a,b,,c" -> {"a", "b", "c"}: the --input lists of the CLI.
std::vector<std::string> split_commas(const std::string& s);

enum class CorpusFormat { kAuto, kText, kJsonl };
CorpusFormat parse_corpus_format(const std::string& s);

struct CorpusOptions {
  std::vector<std::string> inputs;
  CorpusFormat format = CorpusFormat::kAuto;
  size_t split_bytes = 0;            // text files: cut into documents at blank lines after this many bytes (0: never)
  size_t part_bytes = 1 << 20;       // target size of one part of a long document
  size_t max_part_bytes = 64 << 20;  // the longest JSONL line (a JSONL document is read whole)
  size_t max_text_part_bytes = 4 << 20;  // a text part grows to this when `cut` finds no place, then is cut there
  // First position >= at where `text` may be cut, or text.size().
  std::function<size_t(std::string_view, size_t)> cut;
};

struct DocPart {
  std::string text;
  uint64_t doc = 0;    // document index, counting from 0 over the whole corpus
  bool first = false;  // the first part of its document
};

class CorpusReader {
 public:
  explicit CorpusReader(CorpusOptions opt);  // lists the files; throws Error on a missing input
  ~CorpusReader();

  // Appends parts to `out` until about `bytes` of text were added or the
  // corpus ends; returns false when nothing was left.
  bool next_batch(size_t bytes, std::vector<DocPart>& out);

  const std::vector<std::string>& files() const { return files_; }
  // Entries of the input directories that were not read, each "PATH (why)":
  // FIFOs, sockets, links to directories (the walk does not follow them),
  // dangling links.  Names starting with '.' are skipped without a word.
  const std::vector<std::string>& skipped() const { return skipped_; }
  uint64_t total_file_bytes() const { return total_bytes_; }  // on disk (compressed size for gzip)
  uint64_t consumed_file_bytes() const;                       // read so far, same units
  uint64_t documents() const { return doc_count_; }
  uint64_t text_bytes() const { return text_bytes_; }  // uncompressed bytes yielded

 private:
  struct Source;
  CorpusOptions opt_;
  std::vector<std::string> files_, skipped_;
  std::vector<uint64_t> file_bytes_;
  uint64_t total_bytes_ = 0, done_bytes_ = 0;
  size_t next_file_ = 0;
  std::unique_ptr<Source> src_;
  uint64_t doc_count_ = 0, text_bytes_ = 0;

  bool open_next();
  bool next_part(DocPart& part);
};

}  // namespace attnres

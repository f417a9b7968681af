// corpus.cpp — see corpus.h.
#include "data/corpus.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace attnres {

namespace fs = std::filesystem;

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

CorpusFormat parse_corpus_format(const std::string& s) {
  if (s == "auto") return CorpusFormat::kAuto;
  if (s == "text") return CorpusFormat::kText;
  if (s == "jsonl") return CorpusFormat::kJsonl;
  fail("unknown corpus format '", s, "' (expected auto, text or jsonl)");
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_jsonl_name(const std::string& path) {
  std::string p = path;
  if (ends_with(p, ".gz")) p.resize(p.size() - 3);
  return ends_with(p, ".jsonl") || ends_with(p, ".ndjson");
}

bool printable_ascii(char c) {
  return c >= 0x21 && c <= 0x7e;
}

}  // namespace

size_t line_cut(std::string_view text, size_t at) {
  return pretoken_cut(text, at, nullptr, /*word_gaps=*/true);
}

namespace {

// The first p in [from, to] just after "\n\n" and before a printable ASCII byte, or npos.
size_t blank_line_boundary(std::string_view text, size_t from, size_t to) {
  size_t p = from < 2 ? 0 : from - 2;
  while (true) {
    p = text.find("\n\n", p);
    if (p == std::string_view::npos || p + 2 > to) return std::string_view::npos;
    const size_t q = p + 2;
    if (q >= from && q < text.size() && printable_ascii(text[q])) return q;
    ++p;
  }
}

}  // namespace

struct CorpusReader::Source {
  std::string path;
  gzFile gz = nullptr;
  bool jsonl = false, eof = false;
  uint64_t line = 0;
  std::string buf;  // read, not yet consumed from `pos`
  size_t pos = 0;
  bool doc_open = false;  // a text document has parts out and goes on
  uint64_t doc = 0;
  size_t doc_bytes = 0;

  ~Source() {
    if (gz) gzclose(gz);
  }
  size_t avail() const { return buf.size() - pos; }
  // Reads up to `n` more bytes; sets eof at the end of the file.
  void fill(size_t n) {
    if (pos > 0 && pos >= buf.size() / 2) {
      buf.erase(0, pos);
      pos = 0;
    }
    const size_t old = buf.size();
    n = std::max<size_t>(n, 1 << 16);
    buf.resize(old + n);
    size_t got = 0;
    while (got < n) {
      const unsigned want = unsigned(std::min<size_t>(n - got, 1u << 30));
      const int r = gzread(gz, buf.data() + old + got, want);
      if (r < 0) {
        int code = 0;
        const char* msg = gzerror(gz, &code);
        fail(path, ": read error: ", code == Z_ERRNO ? std::strerror(errno) : msg);
      }
      if (r == 0) {
        int code = 0;
        const char* msg = gzerror(gz, &code);
        if (code != Z_OK) fail(path, ": read error: ", code == Z_BUF_ERROR ? "truncated gzip file" : msg);
        eof = true;
        break;
      }
      got += size_t(r);
    }
    buf.resize(old + got);
  }
};

CorpusReader::CorpusReader(CorpusOptions opt) : opt_(std::move(opt)) {
  if (!opt_.cut) opt_.cut = line_cut;
  if (opt_.inputs.empty()) fail("no corpus inputs given");
  for (const auto& in : opt_.inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    if (ec || !fs::exists(st)) fail(in, ": cannot read: ", ec ? ec.message() : "No such file or directory");
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      fs::recursive_directory_iterator it(in, fs::directory_options::none, ec), end;
      if (ec) fail(in, ": cannot read directory: ", ec.message());
      for (; it != end; it.increment(ec)) {
        if (ec) fail(in, ": cannot read directory: ", ec.message());
        const std::string name = it->path().filename().string();
        if (!name.empty() && name[0] == '.') {
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(ec)) {
          found.push_back(it->path().string());
        } else if (!it->is_directory(ec) || it->is_symlink(ec)) {  // a walked directory is no skip
          const char* what = it->is_symlink(ec) && it->is_directory(ec) ? "a link to a directory, not followed"
                             : it->is_fifo(ec)                           ? "a FIFO"
                             : it->is_socket(ec)                         ? "a socket"
                             : it->is_symlink(ec)                        ? "a dangling link"
                                                                         : "not a regular file";
          skipped_.push_back(cat(it->path().string(), " (", what, ")"));
        }
      }
      std::sort(found.begin(), found.end());
      files_.insert(files_.end(), found.begin(), found.end());
    } else {
      files_.push_back(in);
    }
  }
  for (const auto& f : files_) {
    std::error_code ec;
    const uint64_t n = fs::file_size(f, ec);
    file_bytes_.push_back(ec ? 0 : n);
    total_bytes_ += file_bytes_.back();
  }
}

CorpusReader::~CorpusReader() = default;

uint64_t CorpusReader::consumed_file_bytes() const {
  uint64_t n = done_bytes_;
  if (src_ && src_->gz) n += uint64_t(std::max<z_off_t>(0, gzoffset(src_->gz)));
  return std::min(n, total_bytes_);
}

bool CorpusReader::open_next() {
  if (src_) {
    done_bytes_ += file_bytes_[next_file_ - 1];
    src_.reset();
  }
  if (next_file_ >= files_.size()) return false;
  const std::string& path = files_[next_file_++];
  auto s = std::make_unique<Source>();
  s->path = path;
  errno = 0;
  s->gz = gzopen(path.c_str(), "rb");
  if (!s->gz) fail(path, ": cannot open: ", errno ? std::strerror(errno) : "out of memory");
  gzbuffer(s->gz, 1 << 18);
  s->jsonl = opt_.format == CorpusFormat::kJsonl || (opt_.format == CorpusFormat::kAuto && is_jsonl_name(path));
  src_ = std::move(s);
  return true;
}

bool CorpusReader::next_part(DocPart& part) {
  while (true) {
    if (!src_ && !open_next()) return false;
    Source& s = *src_;

    if (s.jsonl) {
      size_t nl;
      // A JSONL document is held whole: its line is bounded by max_part_bytes
      // (a gzip bomb of one endless line stops here, not in an allocation).
      size_t searched = 0;  // bytes after pos known to hold no newline
      auto too_long = [&] {
        fail(s.path, ":", s.line + 1, ": JSONL line longer than ", opt_.max_part_bytes >> 20,
             " MiB (a document is read whole; split it)");
      };
      while ((nl = std::string_view(s.buf).find('\n', s.pos + searched)) == std::string::npos && !s.eof) {
        searched = s.avail();
        if (searched > opt_.max_part_bytes) too_long();
        s.fill(std::max<size_t>(searched, 1 << 20));
      }
      if ((nl == std::string::npos ? s.avail() : nl - s.pos) > opt_.max_part_bytes) too_long();
      if (s.avail() == 0) {
        open_next();
        if (!src_ && next_file_ >= files_.size()) return false;
        continue;
      }
      const size_t end = nl == std::string::npos ? s.buf.size() : nl;
      std::string_view line(s.buf.data() + s.pos, end - s.pos);
      s.pos = nl == std::string::npos ? s.buf.size() : nl + 1;
      ++s.line;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const nlohmann::json j = parse_json(line, cat(s.path, ":", s.line));
      if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
        fail(s.path, ":", s.line, ": expected a JSON object with a \"text\" string field");
      part.text = j["text"].get<std::string>();
      if (part.text.empty()) continue;
      part.doc = doc_count_++;
      part.first = true;
      text_bytes_ += part.text.size();
      return true;
    }

    // Text: up to part_bytes at a token-preserving cut, or less at a document boundary.
    size_t want = opt_.part_bytes;
    size_t end = 0;
    while (true) {
      while (!s.eof && s.avail() < want + 1) s.fill(want + 1 - s.avail());
      const std::string_view view(s.buf.data() + s.pos, s.avail());
      if (view.size() <= opt_.part_bytes && s.eof) {
        end = view.size();
        break;
      }
      end = opt_.cut(view, opt_.part_bytes);
      if (end < view.size() || s.eof) break;
      if (view.size() >= opt_.max_text_part_bytes) {  // no cut point: cut anyway, between characters
        end = utf8_char_start(view, opt_.max_text_part_bytes, 1);
        break;
      }
      want = view.size() * 2;
    }
    if (end == 0) {  // file done
      open_next();
      if (!src_ && next_file_ >= files_.size()) return false;
      continue;
    }
    const std::string_view view(s.buf.data() + s.pos, end);
    bool doc_ends = false;
    if (opt_.split_bytes > 0) {
      const size_t from = s.doc_bytes < opt_.split_bytes ? opt_.split_bytes - s.doc_bytes : 0;
      if (from < end) {
        const size_t b = blank_line_boundary(view, from, end);
        if (b != std::string_view::npos && b < end) {
          end = b;
          doc_ends = true;
        }
      }
    }
    part.text.assign(s.buf.data() + s.pos, end);
    s.pos += end;
    part.first = !s.doc_open;
    if (!s.doc_open) {
      s.doc = doc_count_++;
      s.doc_open = true;
    }
    part.doc = s.doc;
    s.doc_bytes += end;
    if (doc_ends) {
      s.doc_open = false;
      s.doc_bytes = 0;
    }
    text_bytes_ += end;
    return true;
  }
}

bool CorpusReader::next_batch(size_t bytes, std::vector<DocPart>& out) {
  size_t added = 0;
  bool any = false;
  while (added < bytes) {
    DocPart p;
    if (!next_part(p)) break;
    added += p.text.size();
    out.push_back(std::move(p));
    any = true;
  }
  return any;
}

}  // namespace attnres

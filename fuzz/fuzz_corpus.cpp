// fuzz_corpus.cpp — prepare's corpus reader on a JSONL file (gzip or plain,
// by magic bytes), streamed in small parts with small bounds.
#include <vector>

#include "core/error.h"
#include "data/corpus.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnres::fuzz::MemFile f(data, size);
  for (attnres::CorpusFormat format : {attnres::CorpusFormat::kJsonl, attnres::CorpusFormat::kText}) {
    try {
      attnres::CorpusOptions opt;
      opt.inputs = {f.path()};
      opt.format = format;
      opt.part_bytes = 256;
      opt.max_part_bytes = 1 << 16;
      opt.split_bytes = format == attnres::CorpusFormat::kText ? 128 : 0;
      opt.cut = attnres::line_cut;
      attnres::CorpusReader r(opt);
      std::vector<attnres::DocPart> parts;
      while (r.next_batch(1 << 12, parts)) parts.clear();
    } catch (const attnres::Error&) {
    }
  }
  return 0;
}

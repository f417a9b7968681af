// load.cpp — see load.h.
#include "infer/load.h"

#include <filesystem>

#include "core/error.h"
#include "infer/generate.h"
#include "io/checkpoint.h"

namespace attnres {

ModelSource open_model(const std::string& path, const OpenOptions& o) {
  if (path.empty()) fail("no model given (a checkpoint, run or Hugging Face model directory)");
  ModelSource s;
  s.held = std::make_shared<const HeldModelDir>(path);
  s.dir = s.held->dir();
  s.config = Config::load(s.dir + "/config.json");
  if (o.need != NeedTokenizer::kNo) {
    const std::string tok = o.tokenizer.empty() ? s.dir + "/tokenizer.json" : o.tokenizer;
    if (!o.tokenizer.empty() || std::filesystem::exists(tok)) {
      s.tokenizer = Tokenizer::load_for_model(tok, s.config.V, s.dir + "/config.json");
      s.tokenizer_path = tok;
    } else if (o.need == NeedTokenizer::kYes) {
      fail(tok, ": no such file: ", o.why, ", so it needs the model's tokenizer (", o.how, ")");
    }
  }
  if (o.sampling_defaults) s.sampling = read_sampling_defaults(s.dir);
  if (o.eos_ids) s.eos_ids = read_eos_ids(s.dir);
  return s;
}

std::unique_ptr<Model> load_model(const ModelSource& src, Context& ctx, const InferenceShape& shape,
                                  Precision precision) {
  ModelOptions mo;
  mo.training = false;
  mo.batch = shape.batch;
  mo.seq_len = shape.seq_len;
  mo.rows = shape.rows;
  mo.cache_len = shape.cache_len;
  mo.precision = precision;  // bf16: the matrices held in bf16 only (half the bytes per token)
  auto model = std::make_unique<Model>(ctx, src.config, mo);
  load_weights(*model, src.dir);
  return model;
}

}  // namespace attnres

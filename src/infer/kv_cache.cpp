// kv_cache.cpp — see kv_cache.h.
#include "infer/kv_cache.h"

#include "core/error.h"

namespace attnres {

KvCache::KvCache(Model& model, int64_t seqs, int64_t len) : model_(model), seqs_(seqs) {
  const Config& c = model.config();
  const ModelOptions& o = model.options();
  if (o.training) fail("a KV cache is for inference models only");
  if (len <= 0) len = o.cache_len;
  if (len <= 0) fail("a KV cache of ", len, " positions: the model was built without one (ModelOptions::cache_len)");
  if (len > model.plan().positions)
    fail("a KV cache of ", len, " positions, but the model's RoPE tables cover ", model.plan().positions);
  if (seqs <= 0) fail("a KV cache of ", seqs, " sequences");
  Backend& ops = model.context().ops();
  const int64_t kvd = c.kv_dim();
  const int64_t per = checked_mul(checked_mul(seqs, len, "KV cache positions"), kvd, "KV cache floats");  // one layer's keys
  memory_ = ops.alloc(static_cast<size_t>(checked_mul(2 * c.L, per, "KV cache floats")) * sizeof(float), /*lazy=*/true);
  for (int64_t l = 0; l < c.L; ++l) {
    k_.push_back(memory_.data() + (2 * l) * per);
    v_.push_back(memory_.data() + (2 * l + 1) * per);
  }
  places_ = ops.alloc(static_cast<size_t>(2 * model.B()) * sizeof(int64_t));
  view_ = {k_.data(), v_.data(), len, places_.as<int64_t>(), places_.as<int64_t>() + model.B()};
}

void KvCache::forward(const int32_t* tokens, int64_t B, int64_t T, const int64_t* slot, const int64_t* pos,
                      float* logits) {
  ATTNRES_CHECK(B > 0 && B <= model_.B(), "a cached forward of B=", B, " in a model of B=", model_.B());
  for (int64_t b = 0; b < B; ++b) {
    if (slot[b] < 0 || slot[b] >= seqs_) fail("cache slot ", slot[b], ": the KV cache holds ", seqs_, " sequences");
    if (pos[b] < 0 || T > len() - pos[b])
      fail("positions ", pos[b], "..", pos[b] + T - 1, " are beyond the KV cache of ", len());
  }
  Backend& ops = model_.context().ops();
  ops.upload(places_.as<int64_t>(), slot, static_cast<size_t>(B) * sizeof(int64_t));
  ops.upload(places_.as<int64_t>() + model_.B(), pos, static_cast<size_t>(B) * sizeof(int64_t));
  model_.begin_forward(tokens, B, T, &view_);
  model_.run_sublayers(0, 2 * model_.config().L);
  model_.finish_forward();
  model_.last_logits(logits);
}

}  // namespace attnres

// kv_cache.h — the keys and values of earlier positions, so that a decoder
// runs each new token once: attention's keys (after k_norm and RoPE) and
// values, per layer, for `seqs` sequences of up to `len` positions.
//
// Depth routing mixes the sources of one position, so a routed model needs
// nothing else across time: the cache is attention's alone.  A forward
// through the cache is the model's forward in steps (model/model.h) with the
// cache's view, each sequence continuing its own row of the cache at its own
// position.
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "model/model.h"

namespace attnres {

class KvCache {
 public:
  // A cache of `seqs` sequences of `len` positions for `model` (an inference
  // model whose RoPE tables cover len: ModelOptions::cache_len ≥ len; len ≤ 0
  // takes that).  Its memory is backed lazily: a sequence costs the positions
  // it has used, not the len it may grow to.
  KvCache(Model& model, int64_t seqs, int64_t len = 0);
  KvCache(const KvCache&) = delete;  // the view points into this object
  KvCache& operator=(const KvCache&) = delete;

  Model& model() const { return model_; }
  int64_t seqs() const { return seqs_; }
  int64_t len() const { return view_.len; }

  // Forward over tokens (B, T) where sequence b continues cache row slot[b]
  // at position pos[b] (host arrays of B; positions pos[b] … pos[b]+T−1 are
  // written to the cache, earlier ones must be there already), then writes
  // to `logits` (host, (B, V)) the logits of each sequence's last position.
  void forward(const int32_t* tokens, int64_t B, int64_t T, const int64_t* slot, const int64_t* pos, float* logits);

 private:
  Model& model_;
  int64_t seqs_ = 0;
  Buffer memory_;             // the keys and values: per layer (seqs, len, KV·hd) of each
  std::vector<float*> k_, v_;  // (L) into memory_
  Buffer places_;             // (2B) int64: each sequence's slot, then its first position
  KvCacheView view_;
};

}  // namespace attnres

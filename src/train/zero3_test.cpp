// zero3_test.cpp — ZeRO-3's parts that one process can check: the page
// release, the init of a rank's ranges, the memory plan and its refusal, and
// a one-rank --zero 3 run against --zero 1 (checkpoints in both directions).
// The runs over 2 and 4 ranks (every mode, bf16, the guarded device, resume
// across world sizes and stages, stops, NaN) are tests/distributed/mpi.py's.
#include "train/zero3.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/buffer.h"
#include "core/file_util.h"
#include "eval/perplexity.h"
#include "ops/context.h"
#include "io/checkpoint.h"
#include "io/token_file.h"
#include "model/params.h"
#include "testing/check.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace attnres {
namespace {

using testing::TempDir;

// Pages of [p, p + bytes) that are resident (mincore).
int64_t resident_pages(const void* p, size_t bytes) {
  std::vector<unsigned char> v((bytes + 4095) / 4096);
  EXPECT_EQ(::mincore(const_cast<void*>(p), bytes, v.data()), 0);
  int64_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(Zero3, DiscardZeroesTheRangeAndGivesBackItsWholePages) {
  Buffer b = Buffer::host_bytes(16 * 4096, /*lazy=*/true);
  float* f = b.data();
  const int64_t n = 16 * 1024;
  EXPECT_EQ(resident_pages(f, b.bytes()), 0);  // lazily backed: nothing until touched
  for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(i + 1);
  EXPECT_EQ(resident_pages(f, b.bytes()), 16);
  // Floats [1000, 9000): pages 1 … 7 wholly inside go back; the partial ends are zeroed in place.
  discard(f + 1000, 8000 * sizeof(float));
  EXPECT_EQ(resident_pages(f, b.bytes()), 16 - 7);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f[i], i >= 1000 && i < 9000 ? 0.0f : static_cast<float>(i + 1)) << i;
  discard(f + 5, 3 * sizeof(float));  // within one page: zeroed, nothing given back
  EXPECT_EQ(f[4], 5.0f);
  EXPECT_EQ(f[5], 0.0f);
  EXPECT_EQ(f[8], 9.0f);
}

TEST(Zero3, EachRankInitialisesItsRangesToWhatOneProcessDraws) {
  for (bool tied : {true, false}) {
    Config c = Config::from_json({{"hidden_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                                  {"num_key_value_heads", 1}, {"head_dim", 16}, {"intermediate_size", 48},
                                  {"vocab_size", 100}, {"tie_word_embeddings", tied}, {"attnres_mode", "delta_block"}},
                                 "test");
    const ParamLayout layout(c);
    const int64_t n = layout.total();
    std::vector<float> whole(static_cast<size_t>(n)), part(static_cast<size_t>(n), -7.0f);
    Rng a(42), b(42);
    init_params(layout, c, whole.data(), a);
    // Ranges that cut tensors anywhere (and take some whole).
    const std::vector<ArenaRange> keep = {{3, 200}, {1000, 1001}, {2500, n / 2}, {n / 2 + 17, n - 5}};
    init_params(layout, c, part.data(), b, keep);
    EXPECT_EQ(a.state(), b.state()) << "the same draws, in the same order";
    for (int64_t i = 0; i < n; ++i) {
      bool kept = false;
      for (const ArenaRange& r : keep) kept |= r.lo <= i && i < r.hi;
      ASSERT_EQ(part[static_cast<size_t>(i)], kept ? whole[static_cast<size_t>(i)] : -7.0f) << i;
    }
  }
}

TEST(Zero3, TheMemoryPlanShardsTheStateAndAddsTheGatheredUnit) {
  const Config c = Config::from_json({{"hidden_size", 256}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
                                      {"num_key_value_heads", 2}, {"head_dim", 64}, {"intermediate_size", 768},
                                      {"vocab_size", 8192}, {"tie_word_embeddings", true}},
                                     "test");
  ModelOptions o{1, 64};
  o.precision = Precision::kBF16;
  const ParamLayout layout(c);
  int64_t pm = 0, pv = 0, embed = 0;
  for (const TensorSpec& s : layout.specs()) (s.matrix ? pm : pv) += s.numel;
  embed = c.V * c.d;
  const MemoryPlan one = plan_memory(c, o, 1, 1), z1 = plan_memory(c, o, 4, 1), z3 = plan_memory(c, o, 4, 3);
  // ZeRO-1: 4 + 2 bytes of weights and 4 of gradient per float, the moments over the ranks.
  EXPECT_EQ(one.weights, 6 * pm + 4 * pv);
  EXPECT_EQ(z1.weights, one.weights);
  EXPECT_EQ(z1.gradients, 4 * (pm + pv));
  EXPECT_EQ(one.moments, 8 * (pm + pv));
  EXPECT_NEAR(static_cast<double>(z1.moments), 8.0 * (pm + pv) / 4, 64);
  // ZeRO-3: a quarter of the matrices (pieces rounded up to 16 floats), every vector, and the largest
  // unit gathered — the head, which reads the tied embedding — in bf16 with its float32 gradient.
  EXPECT_NEAR(static_cast<double>(z3.weights), 6.0 * pm / 4 + 4.0 * pv, 6.0 * 16 * layout.specs().size());
  EXPECT_NEAR(static_cast<double>(z3.gradients), 4.0 * pm / 4 + 4.0 * pv, 4.0 * 16 * layout.specs().size());
  EXPECT_EQ(z3.working, embed * (2 + 4));
  EXPECT_EQ(z3.activations, one.activations);
  EXPECT_LT(z3.weights + z3.gradients + z3.moments, (one.weights + one.gradients + one.moments) / 3);
}

// A tiny run's options (the data written into dir).
TrainOptions tiny_run(const std::string& dir, bool tied) {
  std::vector<uint32_t> toks(4000);
  uint64_t x = 11;
  for (auto& t : toks) t = static_cast<uint32_t>((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 58);
  write_token_file(dir + "/train.bin", toks);
  TrainOptions o;
  o.model = Config::from_json({{"hidden_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                               {"num_key_value_heads", 1}, {"head_dim", 8}, {"intermediate_size", 24},
                               {"vocab_size", 64}, {"tie_word_embeddings", tied}, {"attnres_mode", "delta_block"}},
                              "test");
  o.data = dir + "/train.bin";
  o.steps = 6;
  o.batch = 2;
  o.seq_len = 16;
  o.accum = 2;
  o.warmup = 2;
  o.ckpt_every = 3;
  o.quiet = true;
  o.peak_gflops = 100;
  return o;
}

TEST(Zero3, OneRankTrainsAsZeroOneAndTheirCheckpointsResumeEachOther) {
  for (bool tied : {true, false}) {
    TempDir tmp("zero3");
    TrainOptions o = tiny_run(tmp.path(), tied);
    o.out = tmp / "z1";
    const TrainResult z1 = train(o);
    o.zero = 3;
    o.out = tmp / "z3";
    const TrainResult z3 = train(o);
    // One rank holds everything: the same arithmetic but the gradient norm's sum, taken per tensor.
    EXPECT_NEAR(z3.final_loss, z1.final_loss, 1e-6 * std::fabs(z1.final_loss)) << tied;
    // A ZeRO-3 checkpoint resumes under ZeRO-1 and back, each continuing its run.
    o.zero = 1;
    o.resume = tmp / "z3/step_00000003";
    o.out = tmp / "z3to1";
    EXPECT_NEAR(train(o).final_loss, z3.final_loss, 1e-6 * std::fabs(z1.final_loss));
    o.zero = 3;
    o.resume = tmp / "z1/step_00000003";
    o.out = tmp / "z1to3";
    EXPECT_NEAR(train(o).final_loss, z1.final_loss, 1e-6 * std::fabs(z1.final_loss));
    // The checkpoint of ZeRO-3 holds the same tensors (names, shapes, dtypes) as ZeRO-1's.
    for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
      const std::string a = read_file(tmp / (std::string("z1/step_00000006/") + f));
      const std::string b = read_file(tmp / (std::string("z3/step_00000006/") + f));
      ASSERT_EQ(a.size(), b.size()) << f;
      EXPECT_EQ(a.substr(0, 64), b.substr(0, 64)) << f;
    }
  }
}

TEST(Zero3, ValidationPartsRunAsManyForwardsInLockstep) {
  // 7 windows in batches of 2: 4 batches, dealt to 3 parts as 2, 1, 1.  In lockstep every part runs 2
  // forwards (the short ones one with no target), and the parts' sums add up to one part's whole.
  TempDir tmp("zero3val");
  std::vector<uint32_t> toks(7 * 16 + 1);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint32_t>((i * 7) % 64);
  write_token_file(tmp / "val.bin", toks);
  const TokenFile val(tmp / "val.bin");
  const Config c = Config::from_json({{"hidden_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                                      {"num_key_value_heads", 1}, {"head_dim", 8}, {"intermediate_size", 24},
                                      {"vocab_size", 64}},
                                     "test");
  const std::unique_ptr<Context> ctx = open_context({1, "cpu", Precision::kF32});
  ModelOptions mo{2, 16};
  mo.training = false;
  Model m(*ctx, c, mo);
  Rng rng(3);
  m.init(rng);
  EvalOptions whole;
  const EvalResult all = evaluate(m, val, whole);
  double sum = 0;
  int64_t tokens = 0;
  for (const bool lockstep : {false, true})
    for (int part = 0; part < 3; ++part) {
      EvalOptions o;
      o.part = part;
      o.parts = 3;
      o.lockstep = lockstep;
      const uint64_t before = m.forwards();
      const EvalResult r = evaluate(m, val, o);
      EXPECT_EQ(m.forwards() - before, lockstep ? 2u : part == 0 ? 2u : 1u) << part;
      if (lockstep) {
        sum += r.sum;
        tokens += r.tokens;
      }
    }
  EXPECT_EQ(tokens, all.tokens);
  EXPECT_NEAR(sum, all.sum, 1e-9 * std::fabs(all.sum));
}

TEST(Zero3, ItsCheckpointIsTheBytesOneProcessWrites) {
  // The files every rank writes its part of, laid out by rank 0, against save_checkpoint's from the
  // same state: weights in f32 and bf16, with moments, of every tensor or (a frozen base) the routing ones.
  for (const bool bf16 : {false, true})
    for (const bool frozen : {false, true}) {
      TempDir tmp("zero3save");
      const Config c = Config::from_json({{"hidden_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                                          {"num_key_value_heads", 1}, {"head_dim", 16}, {"intermediate_size", 48},
                                          {"vocab_size", 100}, {"attnres_mode", "delta_block"}},
                                         "test");
      const std::unique_ptr<Context> ctx = open_context({1, "cpu", Precision::kF32});
      ModelOptions mo{1, 8};
      mo.sharded_weights = true;
      mo.freeze_base = frozen;
      Model model(*ctx, c, mo);
      const std::unique_ptr<Comm> comm = Comm::single();
      Zero3 z(model, *comm);
      AdamW adamw(ctx->ops(), model.layout(), AdamWConfig{}, frozen, z.owned());
      Rng rng(5);
      z.init(rng);
      const int64_t n = model.layout().total();
      for (int64_t i = 0; i < n; ++i) {  // moments with values of their own
        adamw.m()[i] = 0.001f * static_cast<float>(i % 97);
        adamw.v()[i] = 0.002f * static_cast<float>(i % 89);
      }
      TrainerState st;
      st.step = 7;
      SaveOptions so;
      so.bf16 = bf16;
      if (frozen) so.trained = [&](const TensorSpec& s) { return adamw.trains(s); };
      const std::string a = z.save(tmp / "z3", c, adamw, st, so, /*chunk=*/100);
      const std::string b = save_checkpoint(tmp / "one", c, model.layout(), model.params(), adamw.m(), adamw.v(), st, so);
      for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json", "trainer_state.json"})
        EXPECT_TRUE(read_file(a + "/" + f) == read_file(b + "/" + f)) << f << " bf16 " << bf16 << " frozen " << frozen;
      EXPECT_EQ(read_file(tmp / "z3/latest"), "step_00000007\n");
    }
}

TEST(Zero3, ARunBeyondItsMemoryIsRefusedBeforeItAllocates) {
  TempDir tmp("zero3mem");
  TrainOptions o = tiny_run(tmp.path(), true);
  o.out = tmp / "run";
  o.max_memory = 0.01;  // 10 MiB: less than the program itself
  try {
    train(o);
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the memory plan of this run needs"), std::string::npos) << m;
    EXPECT_NE(m.find("--max-memory 0.01 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("--zero 3"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was allocated"), std::string::npos) << m;
  }
  EXPECT_FALSE(std::filesystem::exists(tmp / "run/step_00000006"));
  TrainOptions bad = o;
  bad.zero = 2;
  EXPECT_THROW_MSG(bad.validate(), "--zero must be 1 or 3, got 2");
  bad = o;
  bad.max_memory = -1;
  EXPECT_THROW_MSG(bad.validate(), "--max-memory must be 0");
}

}  // namespace
}  // namespace attnres

// io_test.cpp — safetensors, token files and configs: round trips, and every
// malformed input named in issue 2 rejected with an Error that names the file
// and the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <sstream>
#include <bit>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/buffer.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "core/file_util.h"
#include "io/safetensors.h"
#include "io/token_file.h"
#include "io/weight_files.h"
#include "model/config.h"
#include "model/params.h"
#include "testing/check.h"

namespace attnres {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

// Expects `fn` to throw an Error whose message contains every fragment.
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
  }
}

// A safetensors file from a header string and a data section.
std::string raw_safetensors(const std::string& header, size_t data_bytes) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafeTensors, RoundTripF32AndI32) {
  TempDir tmp;
  SafeTensorsWriter w;
  std::vector<float> a = {1.5f, -2.f, 3.25f, 0.f, 7.f, 8.f};
  std::vector<int32_t> b = {4, -5};
  w.add_f32("a", {2, 3}, a);
  w.add_i32("b", {2}, b);
  w.add_f32("s", {}, std::vector<float>{42.f});
  w.write(tmp / "x.safetensors");
  SafeTensorsReader r(tmp / "x.safetensors");
  EXPECT_EQ(r.read_float("a"), a);
  EXPECT_EQ(r.read_i32("b"), b);
  EXPECT_EQ(r.info("s").shape.size(), 0u);
  EXPECT_EQ(r.read_float("s")[0], 42.f);
  const std::vector<int64_t> shape = {2, 3};
  std::vector<float> out(6);
  r.read_float("a", shape, out);
  EXPECT_EQ(out, a);
}

TEST(SafeTensors, ReadsBf16AndF16) {
  TempDir tmp;
  // 1.0, -2.5 in BF16 and F16; 65504 (max half) and a subnormal half.
  const uint16_t bf16[2] = {0x3F80, 0xC020};
  const uint16_t f16[3] = {0x3C00, 0x7BFF, 0x0001};
  std::string header =
      R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"h":{"dtype":"F16","shape":[3],"data_offsets":[4,10]}})";
  std::string file = raw_safetensors(header, 0);
  file.append(reinterpret_cast<const char*>(bf16), 4);
  file.append(reinterpret_cast<const char*>(f16), 6);
  write_file_atomic(tmp / "h.safetensors", file);
  SafeTensorsReader r(tmp / "h.safetensors");
  EXPECT_EQ(r.read_float("b"), (std::vector<float>{1.f, -2.5f}));
  auto h = r.read_float("h");
  EXPECT_EQ(h[0], 1.f);
  EXPECT_EQ(h[1], 65504.f);
  EXPECT_FLOAT_EQ(h[2], std::ldexp(1.f, -24));
}

TEST(SafeTensors, RejectsMalformedFiles) {
  TempDir tmp;
  const std::string p = tmp / "bad.safetensors";
  // Shorter than the 8-byte length.
  write_file_atomic(p, "abc");
  expect_error([&] { SafeTensorsReader r(p); }, {p, "not a safetensors file"});
  // Header length past the end of the file.
  {
    uint64_t n = 1000;
    write_file_atomic(p, std::string(reinterpret_cast<const char*>(&n), 8) + "{}");
    expect_error([&] { SafeTensorsReader r(p); }, {p, "header length 1000 runs past the end"});
  }
  // Malformed JSON.
  write_file_atomic(p, raw_safetensors("{not json", 0));
  expect_error([&] { SafeTensorsReader r(p); }, {p, "safetensors header: malformed JSON"});
  // Offsets out of range.
  write_file_atomic(p, raw_safetensors(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
  expect_error([&] { SafeTensorsReader r(p); }, {p, "tensor a", "out of range"});
  // Byte range does not match the shape.
  write_file_atomic(p, raw_safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16));
  expect_error([&] { SafeTensorsReader r(p); }, {p, "tensor a", "do not hold shape [3]"});
  // Overlapping tensors.
  write_file_atomic(p, raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                       12));
  expect_error([&] { SafeTensorsReader r(p); }, {p, "overlap"});
  // Unknown dtype.
  write_file_atomic(p, raw_safetensors(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8));
  expect_error([&] { SafeTensorsReader r(p); }, {p, "unknown dtype Q4"});
  // Missing file.
  expect_error([&] { SafeTensorsReader r(tmp / "nope.safetensors"); }, {"nope.safetensors", "cannot open"});
}

TEST(SafeTensors, WrongShapeDtypeOrMissingTensorIsAnError) {
  TempDir tmp;
  SafeTensorsWriter w;
  w.add_f32("a", {2, 2}, std::vector<float>(4));
  w.add_i32("i", {1}, std::vector<int32_t>(1));
  w.write(tmp / "x.safetensors");
  SafeTensorsReader r(tmp / "x.safetensors");
  std::vector<float> out(4);
  const std::vector<int64_t> wrong = {4};
  expect_error([&] { r.read_float("a", wrong, out); }, {"x.safetensors", "tensor a has shape [2, 2], expected [4]"});
  expect_error([&] { r.read_float("i"); }, {"tensor i has dtype I32, which is not supported"});
  expect_error([&] { r.info("b"); }, {"x.safetensors", "missing tensor b"});
}

TEST(Checkpoint, LoadParamsChecksEveryTensor) {
  TempDir tmp;
  Config c = Config::from_json({{"hidden_size", 8}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                                {"num_key_value_heads", 1}, {"head_dim", 4}, {"intermediate_size", 12},
                                {"vocab_size", 11}},
                               "test");
  ParamLayout layout(c);
  std::vector<float> p(layout.total(), 0.5f), q(layout.total(), 0.f);
  write_model_files(tmp.path(), c, layout, p.data());
  load_params(tmp / "model.safetensors", layout, q.data());
  for (const auto& s : layout.specs())
    for (int64_t i = 0; i < s.numel; ++i) ASSERT_EQ(q[s.offset + i], 0.5f) << s.name;
  // Drop one tensor: a clear error naming it.
  SafeTensorsWriter w;
  for (const auto& s : layout.specs())
    if (s.name != "model.layers.0.mlp.up_proj.weight") w.add_f32(s.name, s.shape, {p.data() + s.offset, (size_t)s.numel});
  w.write(tmp / "missing.safetensors");
  expect_error([&] { load_params(tmp / "missing.safetensors", layout, q.data()); },
               {"missing.safetensors", "missing tensor model.layers.0.mlp.up_proj.weight"});
}

// Hugging Face fields read as transformers 5 reads them (issue 48.4; the
// same configs go through transformers itself in
// tests/peers/transformers_interop.py): an absent tie_word_embeddings is an
// untied head, an absent rope_theta 10000, and the booleans are booleans.
TEST(Config, HuggingFaceFieldsAreReadAsTransformers5ReadsThem) {
  const nlohmann::json base = {{"model_type", "qwen3"},    {"hidden_size", 8},       {"num_hidden_layers", 1},
                               {"num_attention_heads", 2}, {"intermediate_size", 12}, {"vocab_size", 11}};
  auto with = [&](const char* key, nlohmann::json v) {
    auto j = base;
    j[key] = std::move(v);
    return j;
  };
  const Config plain = Config::from_json(base, "c");
  EXPECT_FALSE(plain.tied);
  EXPECT_EQ(plain.rope_theta, 10000.0);
  EXPECT_EQ(Config::from_json(with("rope_parameters", nlohmann::json::object()), "c").rope_theta, 10000.0);
  EXPECT_TRUE(Config::from_json(with("tie_word_embeddings", true), "c").tied);
  for (const char* key : {"tie_word_embeddings", "attention_bias", "use_sliding_window"})
    for (const nlohmann::json& bad : {nlohmann::json(1), nlohmann::json(0), nlohmann::json(nullptr),
                                      nlohmann::json("false")})
      expect_error([&] { Config::from_json(with(key, bad), "cfg.json"); },
                   {"cfg.json", cat("field \"", key, "\""), "not true or false", "transformers 5 refuses it too"});
  expect_error([&] { Config::from_json(with("attention_bias", true), "cfg.json"); },
               {"field \"attention_bias\" is true", "biases on q/k/v/o projections is not implemented"});
  expect_error([&] { Config::from_json(with("rope_theta", nullptr), "cfg.json"); },
               {"field \"rope_theta\" is null, not a number"});
  expect_error([&] { Config::from_json(with("rope_parameters", {{"rope_theta", nullptr}}), "cfg.json"); },
               {"\"rope_parameters\".rope_theta is null, not a number"});
}

// The tensors a file holds and the model of its config.json does not use are
// an error naming them, as transformers lists them "unexpected"; a tied
// model's lm_head.weight passes only where it equals the embedding.
TEST(Checkpoint, TensorsTheModelDoesNotUseAreNamed) {
  TempDir tmp;
  const nlohmann::json cfg = {{"hidden_size", 8},      {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                              {"num_key_value_heads", 1}, {"head_dim", 4},        {"intermediate_size", 12},
                              {"vocab_size", 11},         {"tie_word_embeddings", true}};
  const Config tied = Config::from_json(cfg, "tied");
  const ParamLayout layout(tied);
  std::vector<float> p(layout.total()), q(layout.total());
  for (const auto& s : layout.specs())  // the padding between tensors stays 0, as a load leaves it
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) p[i] = 0.01f * static_cast<float>(i % 97);
  auto write = [&](const std::string& name, const std::function<void(SafeTensorsWriter&)>& more) {
    SafeTensorsWriter w;
    for (const auto& s : layout.specs()) w.add_f32(s.name, s.shape, {p.data() + s.offset, (size_t)s.numel});
    more(w);
    w.write(tmp / name);
    return tmp / name;
  };
  const std::vector<float> bias(8, 0.f), head(11 * 8, 0.5f);
  const std::vector<int64_t> bias_shape = {8}, head_shape = {11, 8};
  const std::string biased = write("biased.safetensors", [&](SafeTensorsWriter& w) {
    w.add_f32("model.layers.0.self_attn.q_proj.bias", bias_shape, bias);
    w.add_f32("model.layers.1.mlp.up_proj.weight", bias_shape, bias);
  });
  expect_error([&] { load_params(biased, layout, q.data()); },
               {"biased.safetensors: holds 2 tensors that the model of config.json does not have",
                "model.layers.0.self_attn.q_proj.bias, model.layers.1.mlp.up_proj.weight"});
  // A conversion keeps its leniency for another mode's routers only.
  expect_error([&] { load_params(biased, layout, q.data(), nullptr, /*keep_missing_routing=*/true); },
               {"model.layers.0.self_attn.q_proj.bias"});
  const std::string routed = write("routed.safetensors", [&](SafeTensorsWriter& w) {
    w.add_f32("model.layers.0.attn_res_proj.weight", bias_shape, bias);
  });
  EXPECT_EQ(load_params(routed, layout, q.data(), nullptr, true), 0);
  expect_error([&] { load_params(routed, layout, q.data()); }, {"model.layers.0.attn_res_proj.weight"});
  // Tied, with a head of its own: transformers would use the head.
  const std::string headed = write("headed.safetensors", [&](SafeTensorsWriter& w) {
    w.add_f32("lm_head.weight", head_shape, head);
  });
  expect_error([&] { load_params(headed, layout, q.data()); },
               {"headed.safetensors: holds lm_head.weight [11, 8]", "\"tie_word_embeddings\": true",
                "set tie_word_embeddings to false"});
  // ... the same head loads untied.
  auto untied_json = cfg;
  untied_json["tie_word_embeddings"] = false;
  const ParamLayout untied(Config::from_json(untied_json, "untied"));
  std::vector<float> u(untied.total());
  load_params(headed, untied, u.data());
  // Tied, with a head equal to the embedding (some writers save both): loads.
  const TensorSpec& embed = layout.specs().front();
  ASSERT_EQ(embed.name, "model.embed_tokens.weight");
  const std::string copied = write("copied.safetensors", [&](SafeTensorsWriter& w) {
    w.add_f32("lm_head.weight", head_shape, {p.data() + embed.offset, (size_t)embed.numel});
  });
  load_params(copied, layout, q.data());
  EXPECT_EQ(q, p);
  // The reference's null sources in a mode that reads none (it creates them
  // whenever attnres_use_null_source is set): loaded past, not refused.
  auto block_json = cfg;
  block_json["attnres_mode"] = "block";
  block_json["attnres_num_blocks"] = 1;
  block_json["attnres_use_null_source"] = true;
  const ParamLayout block(Config::from_json(block_json, "block"));
  std::vector<float> b(block.total(), 0.5f);
  SafeTensorsWriter bw;
  for (const auto& s : block.specs()) bw.add_f32(s.name, s.shape, {b.data() + s.offset, (size_t)s.numel});
  bw.add_f32("model.layers.0.attn_null_source", bias_shape, bias);
  bw.add_f32("model.layers.0.mlp_null_source", bias_shape, bias);
  bw.write(tmp / "block.safetensors");
  load_params(tmp / "block.safetensors", block, b.data());
  block_json["attnres_use_null_source"] = false;  // ... but not where the config does not ask for them
  const ParamLayout block_plain(Config::from_json(block_json, "block"));
  expect_error([&] { load_params(tmp / "block.safetensors", block_plain, b.data()); },
               {"holds 2 tensors", "model.layers.0.attn_null_source"});
  // Untied (the default where config.json says nothing) without a head: the
  // error says which field asked for it.
  const std::string plain = write("plain.safetensors", [](SafeTensorsWriter&) {});
  expect_error([&] { load_params(plain, untied, u.data()); },
               {"plain.safetensors: missing tensor lm_head.weight", "tie_word_embeddings is false or absent"});
}

// A checkpoint being read (export, eval, --init of a run in progress) is held
// against the run's rotation (issue 48.6: export raced it and lost the
// tokenizer): the rotation leaves a held checkpoint, and takes it at the
// first save after the reader lets go; a rewritten step's previous copy too.
TEST(Checkpoint, ACheckpointBeingReadOutlivesTheRotation) {
  TempDir tmp;
  const Config c = Config::from_json({{"hidden_size", 8}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                                      {"intermediate_size", 12}, {"vocab_size", 11}},
                                     "test");
  const ParamLayout layout(c);
  std::vector<float> p(layout.total(), 0.25f);
  write_file_atomic(tmp / "tokenizer.json", "{}");
  SaveOptions so;
  so.optimizer = false;
  so.keep = 1;
  so.copy_files = {tmp / "tokenizer.json"};
  const std::string run = tmp / "run";
  fs::create_directories(run);
  auto save = [&](int64_t step) {
    TrainerState st;
    st.step = step;
    return save_checkpoint(run, c, layout, p.data(), nullptr, nullptr, st, so);
  };
  const std::string first = save(1);
  {
    const HeldModelDir held(run);  // the run's latest: step 1
    EXPECT_EQ(fs::canonical(held.dir()), fs::canonical(first));
    save(2);  // past --keep 1, but held
    EXPECT_TRUE(fs::exists(first + "/tokenizer.json"));
    EXPECT_TRUE(fs::exists(first + "/model.safetensors"));
    const HeldModelDir again(first);  // readers share it
    save(2);  // the same step again: its previous copy is removed, as nobody reads it
    EXPECT_EQ(list_checkpoints(run).size(), 2u);
  }
  save(3);  // released: the rotation takes every older one
  EXPECT_EQ(list_checkpoints(run), std::vector<std::string>{run + "/step_00000003"});
  // A reader of a rewritten step keeps the copy it opened.
  {
    const HeldModelDir held(run);
    const std::string before = read_file(held.dir() + "/config.json");
    save(3);
    EXPECT_EQ(read_file(held.dir() + "/config.json"), before);
  }
  // Nothing left to hold: one clear line.
  fs::remove_all(run + "/step_00000003");
  expect_error([&] { HeldModelDir gone(run); }, {"latest names step_00000003", "holds no config.json"});
}

// A save that runs out of space says what it needs and what is free: two
// numbers that differ are never shown alike ("needs about 3.5 MiB; has 3.5
// MiB free", issue 48): sizes that round alike are given in bytes.
TEST(Checkpoint, TheSpaceNoteNeverShowsTwoEqualSizes) {
  TempDir tmp;
  const uint64_t free_now = fs::space(tmp.path()).available;
  const std::string note = space_note(tmp.path(), free_now + 1);
  const size_t a = note.find("needs about "), b = note.find("; "), c = note.find(" has "), e = note.rfind(" free");
  ASSERT_TRUE(a != std::string::npos && b != std::string::npos && c != std::string::npos && e != std::string::npos)
      << note;
  EXPECT_NE(note.substr(a + 12, b - a - 12), note.substr(c + 5, e - c - 5)) << note;
  EXPECT_NE(space_note(tmp.path(), 1).find("needs about 1 KiB"), std::string::npos);
}

// A ZeRO run's checkpoint: the moments come piece by piece from a fetch
// function (in arena order, exp_avg first) and make the same file as whole
// arenas; ranges of it read back into range-sized buffers.
TEST(Checkpoint, MomentsStreamInAndReadBackAsRanges) {
  TempDir tmp;
  // A vocabulary of 40000 × 8: the embedding crosses the writer's 2^18-float pieces.
  Config c = Config::from_json({{"hidden_size", 8}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                                {"num_key_value_heads", 1}, {"head_dim", 4}, {"intermediate_size", 12},
                                {"vocab_size", 40000}},
                               "test");
  ParamLayout layout(c);
  const int64_t n = layout.total();
  std::vector<float> p(n), m(n), v(n);  // the 64-byte padding between tensors stays 0 (not in the files)
  for (const auto& t : layout.specs())
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) p[i] = 0.001f * i, m[i] = 0.5f * i, v[i] = 0.25f * i;
  TrainerState st;
  st.step = 7;
  const std::string whole = save_checkpoint(tmp / "whole", c, layout, p.data(), m.data(), v.data(), st);
  SaveOptions so;
  int last_k = 0;
  int64_t last_end = 0;
  so.fetch_moments = [&](int k, int64_t at, std::span<float> out) {
    EXPECT_GE(k, last_k);  // every exp_avg piece before the first exp_avg_sq one
    if (k != last_k) last_end = 0;
    EXPECT_GE(at, last_end);  // increasing offsets
    last_k = k, last_end = at + static_cast<int64_t>(out.size());
    std::copy_n((k == 0 ? m : v).data() + at, out.size(), out.data());
  };
  const std::string streamed = save_checkpoint(tmp / "streamed", c, layout, p.data(), nullptr, nullptr, st, so);
  EXPECT_EQ(last_k, 1);
  EXPECT_EQ(read_file(whole + "/optimizer.safetensors"), read_file(streamed + "/optimizer.safetensors"));
  // Three ranges that cut through tensors, each read into its own buffer.
  const std::vector<int64_t> cuts = {0, 1000, n / 2 + 3, n};
  for (size_t r = 0; r + 1 < cuts.size(); ++r) {
    const int64_t lo = cuts[r], hi = cuts[r + 1];
    std::vector<float> q(n), mr(hi - lo), vr(hi - lo);
    EXPECT_EQ(load_checkpoint(streamed, layout, q.data(), mr.data(), vr.data(), nullptr, 1, lo, hi).step, 7);
    EXPECT_EQ(q, p);
    EXPECT_TRUE(std::equal(mr.begin(), mr.end(), m.begin() + lo)) << "range " << lo << ".." << hi;
    EXPECT_TRUE(std::equal(vr.begin(), vr.end(), v.begin() + lo)) << "range " << lo << ".." << hi;
  }
}

TEST(Checkpoint, PlainQwen3CheckpointConvertsToARoutedLayout) {
  TempDir tmp;
  nlohmann::json j = {{"hidden_size", 8}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                      {"num_key_value_heads", 1}, {"head_dim", 4}, {"intermediate_size", 12}, {"vocab_size", 11}};
  Config plain = Config::from_json(j, "plain");
  ParamLayout pl(plain);
  std::vector<float> p(pl.total(), 0.25f);
  write_model_files(tmp.path(), plain, pl, p.data());
  j["attnres_mode"] = "delta";
  j["attnres_gate_type"] = "learnable_alpha";
  Config routed = Config::from_json(j, "routed");
  ParamLayout rl(routed);
  std::vector<float> q(rl.total(), -1.f);
  // Without the conversion flag a routing tensor is simply missing.
  expect_error([&] { load_params(tmp / "model.safetensors", rl, q.data()); },
               {"model.safetensors", "missing tensor model.layers.0.attn_res_proj.weight"});
  // With it, the 2 layers × 2 routers × (proj, norm, alpha) keep what was there.
  EXPECT_EQ(load_params(tmp / "model.safetensors", rl, q.data(), nullptr, true), 12);
  for (const auto& s : rl.specs())
    EXPECT_EQ(q[s.offset], is_routing_param(s.name) ? -1.f : 0.25f) << s.name;
}

// The hub's sharded form: an index naming shards.  It loads exactly like one
// file, and each malformed variant is one clear error line.
TEST(Checkpoint, ShardedDirectoriesLoadAndBadShardsAreNamed) {
  TempDir tmp;
  Config c = Config::from_json({{"hidden_size", 8}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                                {"num_key_value_heads", 1}, {"head_dim", 4}, {"intermediate_size", 12},
                                {"vocab_size", 11}, {"tie_word_embeddings", false}},
                               "test");
  ParamLayout layout(c);
  std::vector<float> p(layout.total());
  for (size_t i = 0; i < p.size(); ++i) p[i] = 0.001f * static_cast<float>(i);
  // Shard k holds the tensors of layer k, shard 2 the rest; BF16 like the hub.
  auto shard_of = [](const std::string& name) {
    return name.find("layers.0.") != std::string::npos ? 0 : name.find("layers.1.") != std::string::npos ? 1 : 2;
  };
  auto file = [](int k) { return cat("model-0000", k + 1, "-of-00003.safetensors"); };
  auto write_shards = [&](const std::string& dir, const char* dtype_of_shard1) {
    std::filesystem::create_directories(dir);
    nlohmann::json map;
    for (int k = 0; k < 3; ++k) {
      SafeTensorsWriter w;
      for (const auto& s : layout.specs()) {
        if (shard_of(s.name) != k) continue;
        std::span<const float> v(p.data() + s.offset, static_cast<size_t>(s.numel));
        if (k == 1 && std::string(dtype_of_shard1) == "F32") w.add_f32(s.name, s.shape, v);
        else w.add_bf16(s.name, s.shape, v);
        map[s.name] = file(k);
      }
      w.write(dir + "/" + file(k));
    }
    write_file_atomic(dir + "/model.safetensors.index.json",
                      nlohmann::json({{"metadata", {{"total_size", 0}}}, {"weight_map", map}}).dump(1));
    return map;
  };
  const std::string good = tmp / "good";
  nlohmann::json map = write_shards(good, "BF16");
  std::vector<float> q(layout.total());
  load_params(good, layout, q.data(), nullptr, false, 2);
  for (const auto& s : layout.specs())
    for (int64_t i = 0; i < s.numel; ++i)
      ASSERT_EQ(q[s.offset + i], bf16_to_float(float_to_bf16(p[s.offset + i]))) << s.name;
  EXPECT_EQ(WeightFiles(good).num_files(), 3u);
  const std::string index = good + "/model.safetensors.index.json";
  auto with_index = [&](const nlohmann::json& m) {
    write_file_atomic(index, nlohmann::json({{"weight_map", m}}).dump());
  };
  // An index naming a missing shard.
  auto m = map;
  m["model.norm.weight"] = "model-00009-of-00009.safetensors";
  with_index(m);
  expect_error([&] { WeightFiles f(good); }, {"index.json", "names shard model-00009-of-00009.safetensors",
                                              "does not exist"});
  // A shard path that leaves the directory.
  m = map;
  m["model.norm.weight"] = "../model-00001-of-00003.safetensors";
  with_index(m);
  expect_error([&] { WeightFiles f(good); }, {"index.json", "not a plain file name"});
  // A tensor listed in a shard that does not hold it.
  m = map;
  m["model.layers.0.mlp.up_proj.weight"] = file(1);
  with_index(m);
  expect_error([&] { WeightFiles f(good); },
               {"index.json", "lists tensor model.layers.0.mlp.up_proj.weight in " + file(1), "does not hold it"});
  // A tensor listed but absent from every shard.
  m = map;
  m["model.layers.7.mlp.up_proj.weight"] = file(0);
  with_index(m);
  expect_error([&] { WeightFiles f(good); }, {"lists tensor model.layers.7.mlp.up_proj.weight", "does not hold it"});
  // Malformed index.
  write_file_atomic(index, "{\"weight_map\": [");
  expect_error([&] { WeightFiles f(good); }, {"index.json", "malformed JSON"});
  write_file_atomic(index, "{}");
  expect_error([&] { WeightFiles f(good); }, {"index.json", "no \"weight_map\""});
  with_index(map);
  // A tensor in two shards.
  {
    SafeTensorsWriter w;
    for (const auto& s : layout.specs())
      if (shard_of(s.name) == 1 || s.name == "model.norm.weight")
        w.add_bf16(s.name, s.shape, {p.data() + s.offset, static_cast<size_t>(s.numel)});
    w.write(good + "/" + file(1));
    expect_error([&] { WeightFiles f(good); }, {"tensor model.norm.weight is in two shards", file(1), file(2)});
  }
  // Shards that disagree on dtype.
  const std::string mixed = tmp / "mixed";
  write_shards(mixed, "F32");
  expect_error([&] { WeightFiles f(mixed); }, {"shards disagree on dtype", "BF16", "F32"});
  // An unsupported dtype: an I8 matrix is refused by name when read as a weight.
  {
    const std::string dir = tmp / "int8";
    std::filesystem::create_directories(dir);
    std::string header = R"({"model.norm.weight":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})";
    write_file_atomic(dir + "/model.safetensors", raw_safetensors(header, 8));
    WeightFiles f(dir);
    std::vector<float> out(8);
    const std::vector<int64_t> shape = {8};
    expect_error([&] { f.read_float("model.norm.weight", shape, out); },
                 {"model.norm.weight has dtype I8", "not supported", "F32, BF16, F16 or F64"});
    header = R"({"model.norm.weight":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})";
    write_file_atomic(dir + "/model.safetensors", raw_safetensors(header, 8));
    WeightFiles g(dir);
    expect_error([&] { g.read_float("model.norm.weight", shape, out); }, {"dtype F8_E4M3", "not supported"});
  }
  // A directory with neither form.
  expect_error([&] { WeightFiles f(tmp / "none"); }, {"none"});
  std::filesystem::create_directories(tmp / "empty");
  expect_error([&] { WeightFiles f(tmp / "empty"); }, {"holds neither model.safetensors nor"});
}

TEST(TokenFile, RoundTripBothVersions) {
  TempDir tmp;
  std::vector<uint32_t> small = {1, 2, 65535, 0, 7};
  write_token_file(tmp / "a.bin", small);
  TokenFile a(tmp / "a.bin");
  EXPECT_EQ(a.version(), 1);
  ASSERT_EQ(a.size(), small.size());
  for (size_t i = 0; i < small.size(); ++i) EXPECT_EQ(a[i], small[i]);
  std::vector<uint32_t> big = {70000, 3, 151935};
  write_token_file(tmp / "b.bin", big);
  TokenFile b(tmp / "b.bin");
  EXPECT_EQ(b.version(), 2);
  for (size_t i = 0; i < big.size(); ++i) EXPECT_EQ(b[i], big[i]);
  std::vector<int32_t> out(2);
  b.read(1, out);
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], 151935);
}

TEST(TokenFile, RejectsWrongFormat) {
  TempDir tmp;
  const std::string p = tmp / "t.bin";
  write_file_atomic(p, "hello");
  expect_error([&] { TokenFile f(p); }, {p, "shorter than the 1024-byte header"});
  std::vector<int32_t> header(256, 0);
  header[0] = 12345;
  write_file_atomic(p, std::string(reinterpret_cast<char*>(header.data()), 1024));
  expect_error([&] { TokenFile f(p); }, {p, "magic 12345"});
  header[0] = kTokenFileMagic;
  header[1] = 3;
  write_file_atomic(p, std::string(reinterpret_cast<char*>(header.data()), 1024));
  expect_error([&] { TokenFile f(p); }, {p, "unsupported token file version 3"});
  header[1] = 1;
  header[2] = 10;  // says 10 tokens, holds 3
  write_file_atomic(p, std::string(reinterpret_cast<char*>(header.data()), 1024) + std::string(6, '\0'));
  expect_error([&] { TokenFile f(p); }, {p, "header says 10 tokens"});
  expect_error([&] { TokenFile f(tmp / "none.bin"); }, {"none.bin", "cannot open"});
}

TEST(TokenFile, TokenIdsAtOrAboveVocabAreAnError) {
  TempDir tmp;
  write_token_file(tmp / "v.bin", std::vector<uint32_t>{1, 2, 97, 3});
  TokenFile f(tmp / "v.bin");
  f.check_vocab(98);
  expect_error([&] { f.check_vocab(97); }, {"v.bin", "token id 97 at position 2", "vocab_size 97"});
}

TEST(Config, RejectsMissingMalformedAndInconsistent) {
  TempDir tmp;
  expect_error([&] { Config::load(tmp / "config.json"); }, {"config.json", "cannot open"});
  write_file_atomic(tmp / "config.json", "{ \"hidden_size\": 8, ");
  expect_error([&] { Config::load(tmp / "config.json"); }, {"config.json", "malformed JSON"});
  nlohmann::json j = {{"hidden_size", 8}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                      {"intermediate_size", 12}, {"vocab_size", 11}, {"some_unknown_field", "ignored"}};
  Config ok = Config::from_json(j, "cfg");
  EXPECT_EQ(ok.hd, 4);  // head_dim defaults to d / H
  EXPECT_EQ(ok.KV, 2);
  auto missing = j;
  missing.erase("vocab_size");
  expect_error([&] { Config::from_json(missing, "cfg.json"); }, {"cfg.json", "missing required field \"vocab_size\""});
  auto wrong_type = j;
  wrong_type["hidden_size"] = "eight";
  expect_error([&] { Config::from_json(wrong_type, "cfg.json"); }, {"cfg.json", "\"hidden_size\" must be an integer"});
  auto gqa = j;
  gqa["num_key_value_heads"] = 3;
  expect_error([&] { Config::from_json(gqa, "cfg.json"); }, {"cfg.json", "multiple of num_key_value_heads"});
  auto mode = j;
  mode["attnres_mode"] = "sideways";
  expect_error([&] { Config::from_json(mode, "cfg.json"); }, {"cfg.json", "unknown attnres_mode \"sideways\""});
  // What a published Qwen3 config carries with its plain values loads; fields
  // whose other values change the math are refused by name.
  auto plain = j;
  plain.update({{"rope_scaling", nullptr}, {"use_sliding_window", false}, {"sliding_window", nullptr},
                {"attention_bias", false}, {"hidden_act", "silu"}});
  EXPECT_NO_THROW(Config::from_json(plain, "cfg.json"));
  for (const auto& [key, bad] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}},
           {"use_sliding_window", true},
           {"attention_bias", true},
           {"hidden_act", "gelu"}}) {
    auto c = plain;
    c[key] = bad;
    expect_error([&] { Config::from_json(c, "cfg.json"); }, {"cfg.json", "field \"" + key + "\"", "not implemented"});
  }
  // Round trip through to_json.
  Config back = Config::from_json(ok.to_json(), "back");
  EXPECT_EQ(back.to_json(), ok.to_json());
}

// Every key read is written back with its value (one key list serves both,
// config.cpp: Config::fields): a config with no field at its default.
TEST(Config, EveryKeyReadIsWrittenBack) {
  const nlohmann::json j = {{"hidden_size", 48},
                            {"num_hidden_layers", 3},
                            {"num_attention_heads", 4},
                            {"num_key_value_heads", 2},
                            {"head_dim", 10},
                            {"intermediate_size", 96},
                            {"vocab_size", 77},
                            {"rms_norm_eps", 1e-5},
                            {"rope_theta", 5e5},
                            {"tie_word_embeddings", false},
                            {"max_position_embeddings", 1024},
                            {"attnres_mode", "delta_block"},
                            {"attnres_num_heads", 2},
                            {"attnres_num_blocks", 3},
                            {"attnres_use_null_source", true},
                            {"attnres_block_delta", "true"},
                            {"attnres_gate_type", "learnable_alpha"},
                            {"attnres_query_init", "normal"}};
  const nlohmann::json out = Config::from_json(j, "c.json").to_json();
  for (auto it = j.begin(); it != j.end(); ++it) EXPECT_EQ(out.at(it.key()), it.value()) << it.key();
  // The enumerated fields' names come from one table each, in the errors too.
  for (const auto& [key, message] : std::vector<std::pair<std::string, std::string>>{
           {"attnres_block_delta", "attnres_block_delta must be \"true\" or \"reference\", got \"x\""},
           {"attnres_gate_type",
            "attnres_gate_type must be \"bias\", \"learnable_alpha\", \"sigmoid_scalar\" or \"sigmoid_vector\", got \"x\""},
           {"attnres_query_init", "attnres_query_init must be \"zero\" or \"normal\", got \"x\""}}) {
    nlohmann::json bad = j;
    bad[key] = "x";
    expect_error([&] { Config::from_json(bad, "c.json"); }, {"c.json", message});
  }
}

// transformers 5 writes rope_theta inside rope_parameters and no top-level
// key (tests/peers/transformers_interop.py found it read as the default 1e6).
TEST(Config, Transformers5RopeParameters) {
  const nlohmann::json base = {{"model_type", "qwen3"},    {"hidden_size", 8},  {"num_hidden_layers", 1},
                               {"num_attention_heads", 2}, {"intermediate_size", 12}, {"vocab_size", 11},
                               {"layer_types", {"full_attention"}}, {"dtype", "bfloat16"}};
  auto with = [&](nlohmann::json rp) {
    auto j = base;
    j["rope_parameters"] = std::move(rp);
    return j;
  };
  EXPECT_EQ(Config::from_json(with({{"rope_theta", 5000.0}, {"rope_type", "default"}}), "c").rope_theta, 5000.0);
  EXPECT_EQ(Config::from_json(with({{"rope_theta", 5000}}), "c").rope_theta, 5000.0);        // type defaults to default
  EXPECT_EQ(Config::from_json(with({{"rope_theta", 5000}, {"type", "default"}}), "c").rope_theta, 5000.0);
  EXPECT_EQ(Config::from_json(with({{"rope_type", "default"}}), "c").rope_theta, 10000.0);  // no theta: transformers' 10000
  EXPECT_EQ(Config::from_json(with(nullptr), "c").rope_theta, 10000.0);
  EXPECT_EQ(Config::from_json(with({{"rope_theta", 7.0}, {"partial_rotary_factor", 1.0}}), "c").rope_theta, 7.0);
  // Both: rope_parameters wins, as in transformers (its top-level key is the legacy one).
  auto both = with({{"rope_theta", 5000.0}, {"rope_type", "default"}});
  both["rope_theta"] = 10000.0;
  EXPECT_EQ(Config::from_json(both, "c").rope_theta, 5000.0);
  // The 4.x spelling alone still loads.
  auto legacy = base;
  legacy["rope_theta"] = 20000.0;
  EXPECT_EQ(Config::from_json(legacy, "c").rope_theta, 20000.0);
  // Scaled or partial RoPE is refused by name; a malformed value is an error.
  for (const nlohmann::json& bad :
       {nlohmann::json{{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e6}},
        nlohmann::json{{"type", "linear"}, {"factor", 2.0}}, nlohmann::json{{"rope_type", "llama3"}},
        nlohmann::json{{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}})
    expect_error([&] { Config::from_json(with(bad), "cfg.json"); },
                 {"cfg.json", "field \"rope_parameters\"", "not implemented"});
  expect_error([&] { Config::from_json(with("default"), "cfg.json"); },
               {"cfg.json", "\"rope_parameters\" must be an object"});
  expect_error([&] { Config::from_json(with({{"rope_theta", "big"}}), "cfg.json"); },
               {"cfg.json", "\"rope_parameters\".rope_theta is \"big\", not a number"});
  expect_error([&] { Config::from_json(with({{"rope_theta", -1.0}}), "cfg.json"); },
               {"cfg.json", "rope_theta must be positive"});
}

// Crafted inputs (issue 9): sizes that would overflow, JSON nested too deep
// for a recursive walk, numbers out of range, allocations that cannot be
// made, empty tensors — each one clear error line, or correct handling.
TEST(Hardening, CraftedSizesAndJsonAreClearErrors) {
  TempDir tmp;
  const nlohmann::json base = {{"hidden_size", 8}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                               {"intermediate_size", 12}, {"vocab_size", 11}};
  auto with = [&](const char* key, nlohmann::json v) {
    auto j = base;
    j[key] = v;
    return j;
  };
  expect_error([&] { Config::from_json(with("vocab_size", int64_t{1} << 62), "c.json"); },
               {"c.json", "vocab_size 4611686018427387904 is beyond what this engine supports"});
  expect_error([&] { Config::from_json(with("num_hidden_layers", int64_t{1} << 40), "c.json"); },
               {"num_hidden_layers", "beyond"});
  expect_error([&] { Config::from_json(with("rope_theta", 1e308 * 10), "c.json"); }, {"rope_theta", "finite"});
  // A config value nested 100k deep, and a number beyond double.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write_file_atomic(tmp / "deep.json", "{\"hidden_size\": " + deep + "}");
  expect_error([&] { Config::load(tmp / "deep.json"); }, {"deep.json", "nested deeper than 64 levels"});
  write_file_atomic(tmp / "big.json", "{\"rope_theta\": 1e400}");
  expect_error([&] { Config::load(tmp / "big.json"); }, {"big.json", "malformed JSON", "1e400"});
  // Safetensors: a shape whose element count overflows, with no bytes; 1e400 in the header.
  write_file_atomic(tmp / "huge.safetensors",
                    raw_safetensors(R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0));
  expect_error([&] { SafeTensorsReader r(tmp / "huge.safetensors"); }, {"huge.safetensors", "tensor t", "too many elements"});
  write_file_atomic(tmp / "e400.safetensors",
                    raw_safetensors(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,1e400]}})", 4));
  expect_error([&] { SafeTensorsReader r(tmp / "e400.safetensors"); }, {"e400.safetensors", "malformed JSON"});
  // Floats where integers belong (found by the fuzzers: the conversion was undefined).
  write_file_atomic(tmp / "fshape.safetensors",
                    raw_safetensors(R"({"t":{"dtype":"F32","shape":[7.46117e+19],"data_offsets":[0,4]}})", 4));
  expect_error([&] { SafeTensorsReader r(tmp / "fshape.safetensors"); },
               {"fshape.safetensors", "\"shape\" holds 7.46117e+19, not a non-negative integer"});
  expect_error([&] { Config::from_json(with("max_position_embeddings", 1.11111e+95), "c.json"); },
               {"c.json", "max_position_embeddings", "wrong type"});
  expect_error([&] { Config::from_json(with("hidden_size", 8.5), "c.json"); }, {"hidden_size", "must be an integer"});
  // A rejected token file leaves no mapping behind (the fuzzer ran out of them).
  {
    std::vector<int32_t> header(256, 0);
    header[0] = kTokenFileMagic;
    header[1] = 2;
    header[2] = 10;  // claims 10 tokens, holds none
    write_file_atomic(tmp / "short.bin", std::string(reinterpret_cast<char*>(header.data()), 1024));
    auto mappings = [] {
      std::istringstream maps(read_file("/proc/self/maps"));
      return std::count(std::istreambuf_iterator<char>(maps), std::istreambuf_iterator<char>(), '\n');
    };
    const auto before = mappings();
    for (int i = 0; i < 200; ++i) EXPECT_THROW(TokenFile f(tmp / "short.bin"), Error);
    EXPECT_LT(mappings(), before + 20);
  }
  // A zero-element tensor reads as nothing (no null-pointer copies).
  write_file_atomic(tmp / "empty.safetensors",
                    raw_safetensors(R"({"t":{"dtype":"BF16","shape":[0,4],"data_offsets":[0,0]}})", 0));
  SafeTensorsReader empty(tmp / "empty.safetensors");
  EXPECT_TRUE(empty.read_float("t").empty());
  std::vector<uint16_t> none;
  const std::vector<int64_t> shape04 = {0, 4};
  empty.read_bf16("t", shape04, none);
  // Memory that cannot be had is an Error, not std::bad_alloc.
  expect_error([] { Buffer::host_bytes(size_t{1} << 60); }, {"cannot allocate", "GiB"});
  // Sizes of one forward.
  expect_error([] { batch_tokens(int64_t{1} << 62, 256); }, {"batch 4611686018427387904", "2^30 tokens"});
  expect_error([] { checked_mul(int64_t{1} << 40, int64_t{1} << 40, "x"); }, {"x: ", "overflows"});
}

// The Qwen3 dense family as published (config.json fields of Qwen3-0.6B …
// 32B): each loads, as a plain model, with the parameter count of its shape.
TEST(Config, TheQwen3DenseFamilyLoads) {
  struct Member {
    const char* name;
    int64_t d, L, H, F;
    bool tied;
  };
  for (const Member& m : {Member{"0.6B", 1024, 28, 16, 3072, true}, Member{"1.7B", 2048, 28, 16, 6144, true},
                          Member{"4B", 2560, 36, 32, 9728, true}, Member{"8B", 4096, 36, 32, 12288, false},
                          Member{"14B", 5120, 40, 40, 17408, false}, Member{"32B", 5120, 64, 64, 25600, false}}) {
    const nlohmann::json j = {
        {"architectures", {"Qwen3ForCausalLM"}}, {"attention_bias", false}, {"attention_dropout", 0.0},
        {"bos_token_id", 151643}, {"eos_token_id", 151645}, {"head_dim", 128}, {"hidden_act", "silu"},
        {"hidden_size", m.d}, {"initializer_range", 0.02}, {"intermediate_size", m.F},
        {"max_position_embeddings", 40960}, {"max_window_layers", m.L}, {"model_type", "qwen3"},
        {"num_attention_heads", m.H}, {"num_hidden_layers", m.L}, {"num_key_value_heads", 8},
        {"rms_norm_eps", 1e-6}, {"rope_scaling", nullptr}, {"rope_theta", 1000000}, {"sliding_window", nullptr},
        {"tie_word_embeddings", m.tied}, {"torch_dtype", "bfloat16"}, {"transformers_version", "4.51.0"},
        {"use_cache", true}, {"use_sliding_window", false}, {"vocab_size", 151936}};
    const Config c = Config::from_json(j, m.name);
    EXPECT_EQ(c.mode, Mode::kBaseline) << m.name;
    EXPECT_EQ(c.hd, 128) << m.name;
    // Parameters: embedding (+ head if untied), per layer 2 norms + q,k,v,o + q/k norms + MLP, final norm.
    const int64_t V = 151936, per_layer = 2 * m.d + m.d * (m.H * 128 + 2 * 8 * 128) + m.H * 128 * m.d + 2 * 128 +
                                          3 * m.d * m.F;
    EXPECT_EQ(ParamLayout(c).total(), V * m.d * (m.tied ? 1 : 2) + m.L * per_layer + m.d) << m.name;
  }
  // The published 0.6B: 596,049,920 parameters (0.44B without the embedding).
  Config c06 = Config::from_json({{"hidden_size", 1024}, {"num_hidden_layers", 28}, {"num_attention_heads", 16},
                                  {"num_key_value_heads", 8}, {"head_dim", 128}, {"intermediate_size", 3072},
                                  {"vocab_size", 151936}, {"tie_word_embeddings", true}},
                                 "0.6B");
  EXPECT_EQ(ParamLayout(c06).total(), 596049920);
}

// Defaults follow whoever wrote the config (docs/DESIGN.md §2), and routed
// models are written the way the reference code writes them.
TEST(Config, DefaultsFollowTheWriterAndRoutedModelsAreWrittenAsQwen3AttnRes) {
  const nlohmann::json plain = {{"model_type", "qwen3"},  {"hidden_size", 8}, {"num_hidden_layers", 1},
                                {"num_attention_heads", 2}, {"intermediate_size", 12}, {"vocab_size", 11}};
  Config c = Config::from_json(plain, "plain");
  EXPECT_EQ(c.mode, Mode::kBaseline);
  EXPECT_EQ(c.block_delta, BlockDelta::kTrue);  // models created here
  // The reference code: qwen3_attnres, no attnres_block_delta, maybe no attnres_mode.
  auto ref = plain;
  ref["model_type"] = "qwen3_attnres";
  c = Config::from_json(ref, "ref");
  EXPECT_EQ(c.mode, Mode::kBlock);
  EXPECT_EQ(c.block_delta, BlockDelta::kReference);
  ref["attnres_mode"] = "delta_block";
  ref["attnres_num_blocks"] = 4;
  c = Config::from_json(ref, "ref");
  EXPECT_EQ(c.mode, Mode::kDeltaBlock);
  EXPECT_EQ(c.block_delta, BlockDelta::kReference);
  ref["attnres_block_delta"] = "true";
  EXPECT_EQ(Config::from_json(ref, "ref").block_delta, BlockDelta::kTrue);
  // Written here: every attnres key explicit; routed modes as qwen3_attnres.
  c.mode = Mode::kDeltaBlock;
  nlohmann::json j = c.to_json("bfloat16");
  EXPECT_EQ(j["model_type"], "qwen3_attnres");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"Qwen3AttnResForCausalLM"}));
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  for (const char* key : {"attnres_mode", "attnres_num_blocks", "attnres_block_delta", "attnres_use_null_source",
                          "attnres_gate_type", "attnres_query_init"})
    EXPECT_TRUE(j.contains(key)) << key;
  c.mode = Mode::kBaseline;
  EXPECT_EQ(c.to_json()["model_type"], "qwen3");
  EXPECT_EQ(c.to_json()["architectures"], nlohmann::json::array({"Qwen3ForCausalLM"}));
}

}  // namespace
}  // namespace attnres

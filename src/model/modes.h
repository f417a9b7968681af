// modes.h — the routing modes as one table of facts (docs/routing.md): what
// each router reads, how its result makes the sublayer input, whether there is
// a residual stream, blocks, a final router, a null source, and what a
// training forward keeps for the backward.  params.cpp (which tensors exist)
// and plan.cpp (the sources and routers a model of the mode runs) read these
// facts; model.cpp asks the plan.
//
// Adding a mode: a Mode enumerator, a row below and its name's row in
// kModeNames (the static_asserts check that every enumerator has its rows, in
// order), and which sources its routers read: its case in plan.cpp's one
// switch over Mode, which has no default, so the compiler names it (-Wswitch;
// -Werror in CI).  Nothing else in the engine: the plan wires each sublayer
// from the sources, and model.cpp runs the plan's steps.  A new kind of
// sources (Sources) is a case in each switch over Sources, here and in
// plan.cpp.  Outside the engine, the PyTorch oracle (tests/oracle/oracle.py)
// and docs/DESIGN.md §2 define the mode too.  tests:
// model/modes_test.cpp checks the table against the parameters and routers a
// model of each mode builds, model/plan_test.cpp each mode's plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ops/route_types.h"

namespace attnres {

enum class Mode { kBaseline, kBlock, kFull, kDelta, kDeltaBlock, kBlockAdd, kFullAdditive, kDeltaReplace, kFirstLayer, kDeltaV, kFullV, kPreGated };

// What the routers of a mode read.
enum class Sources {
  kNone,         // no routing (baseline)
  kOutputs,      // e and every sublayer output so far (full, delta)
  kPartialSums,  // the completed block sums and the current partial sum (block)
  kBlockDeltas,  // e and what each completed block added (delta_block)
  kStates,       // the stream after each sublayer so far, S_1 … S_k (full_additive; not e)
  kOutputsAndStream,  // every sublayer output so far (not e), then the current stream x (delta_replace)
  kStreamAndA1,       // the current stream x, then layer 1's attention output a_1 (first_layer, from layer 2 on)
  kSublayerOutputs,   // every sublayer output so far, not e (delta_v)
  kCumulativeStates,  // the stream after each sublayer so far, then the stream again (e alone first; full_v)
};

struct ModeSpec {
  Mode mode;
  const char* name;        // attnres_mode in config.json, as the reference code names it
  Sources sources;
  Combine combine;    // kReplace: input = R;  kAdd: input = x + R
  bool stream;        // a residual stream x += out that the final norm reads
  bool final_router;  // the final norm reads a router over every source instead
  bool null_source;   // attnres_use_null_source applies (a learned source 0)
  bool stores_inputs;  // training keeps each sublayer input; otherwise it is
                       // rebuilt in the backward from the stored logits and sources
  bool keeps_logits;   // training keeps each router's logits (N, H, S) for the backward; not in full,
                       // whose routers read every earlier output (K²/2 of them): its backward computes them again
  bool compared;       // in `attnres compare`'s default --modes (full, O(L²) in its routing, is not)
  bool value_router;   // each attention sublayer has a third router, over the same sources, whose
                       // input feeds the value projection alone (V-stream routing; delta_v, full_v)
  bool source_gates;   // each router gates its sources before the softmax, v_i -> σ(x·Wᵀ + b)∘v_i, a d×d
                       // linear and bias per router (pre_gated)

  constexpr bool routed() const { return sources != Sources::kNone; }
  // Facts that follow from the row.  Each reads `sources` through a switch
  // without a default, so a new kind of sources is a compile error in each.
  //
  // Whether the backward keeps a running gradient dx_: of the stream (modes
  // with one), or of the current partial sum (block: the partial sums inside
  // a block share it instead of owning a gradient buffer).
  constexpr bool running_gradient() const {
    switch (sources) {
      case Sources::kPartialSums: return true;
      case Sources::kNone: case Sources::kOutputs: case Sources::kBlockDeltas: case Sources::kStates:
      case Sources::kOutputsAndStream: case Sources::kStreamAndA1: case Sources::kSublayerOutputs:
      case Sources::kCumulativeStates: return stream;
    }
    return stream;
  }
  // Whether source j owns a gradient buffer: all do, except block's partial
  // sums inside a block (is_block_start: source j is a block's first P_k).
  constexpr bool source_owns_gradient(bool is_block_start) const {
    switch (sources) {
      case Sources::kPartialSums: return is_block_start;
      case Sources::kNone: case Sources::kOutputs: case Sources::kBlockDeltas: case Sources::kStates:
      case Sources::kOutputsAndStream: case Sources::kStreamAndA1: case Sources::kSublayerOutputs:
      case Sources::kCumulativeStates: return true;
    }
    return true;
  }
  // Whether attnres_block_delta applies: the sources are block deltas.
  constexpr bool block_deltas() const {
    switch (sources) {
      case Sources::kBlockDeltas: return true;
      case Sources::kNone: case Sources::kOutputs: case Sources::kPartialSums: case Sources::kStates:
      case Sources::kOutputsAndStream: case Sources::kStreamAndA1: case Sources::kSublayerOutputs:
      case Sources::kCumulativeStates: return false;
    }
    return false;
  }
  // Whether a learnable_alpha gate at 0 makes the model the plain residual one
  // (an exact conversion of a pretrained checkpoint): the gate's base is the
  // stream, (1 − g)·x + g·h, so a zero gate gives x — where the routed term is
  // added to the stream, and in delta_replace, whose last source is the stream.
  // block's and full's last source is a partial sum / the latest output: no
  // such identity.
  constexpr bool zero_gate_is_identity() const {
    return routed() && (combine == Combine::kAdd || last_source_is_stream());
  }
  // Whether every router's last source is the stream as it is there
  // (delta_replace, full_v): a replacing router's gate mixes against it.
  constexpr bool last_source_is_stream() const {
    switch (sources) {
      case Sources::kOutputsAndStream: case Sources::kCumulativeStates: return true;
      case Sources::kNone: case Sources::kOutputs: case Sources::kPartialSums: case Sources::kBlockDeltas:
      case Sources::kStates: case Sources::kStreamAndA1: case Sources::kSublayerOutputs: return false;
    }
    return false;
  }
  // Sublayers write their output straight into a source (no separate output buffer).
  bool outputs_are_sources() const { return sources == Sources::kOutputs || sources == Sources::kPartialSums; }
};

inline constexpr ModeSpec kModeSpecs[] = {
    // mode            name (paper's name)            sources               combine            stream final  null   stores logits compared value gates
    {Mode::kBaseline,   "baseline",    /* standard residual */ Sources::kNone,        Combine::kAdd,     true,  false, false, true,  false, true, false, false},
    {Mode::kBlock,      "block",       /* AttnRes (Block)   */ Sources::kPartialSums, Combine::kReplace, false, true,  false, false, true,  true, false, false},
    {Mode::kFull,       "full",        /* Full AttnRes      */ Sources::kOutputs,     Combine::kReplace, false, true,  false, false, false, false, false, false},
    {Mode::kDelta,      "delta",       /* Delta AttnRes     */ Sources::kOutputs,     Combine::kAdd,     true,  false, true,  false, true,  true, false, false},
    {Mode::kDeltaBlock, "delta_block", /* Delta Block       */ Sources::kBlockDeltas, Combine::kAdd,     true,  false, true,  true,  true,  true, false, false},
    // Not in the papers: block's sources (the partial block sums) combined as
    // the delta modes combine (added to a residual stream), the pair of the
    // two axes the named modes leave out (--sources partial_sums --combine add).
    {Mode::kBlockAdd,   "block_add",   /* (ours)            */ Sources::kPartialSums, Combine::kAdd,     true,  false, true,  true,  true,  false, false, false},
    // The reference code's full_additive: the stream after each sublayer so
    // far (its cumulative states; e is not one), added to the stream.
    {Mode::kFullAdditive, "full_additive", /* (reference)   */ Sources::kStates,      Combine::kAdd,     true,  false, true,  true,  true,  false, false, false},
    // The reference code's delta_replace: every sublayer output so far and the
    // current stream (last), the routed sum replacing the input; the stream
    // still adds each output, and the final norm reads it.
    {Mode::kDeltaReplace, "delta_replace", /* (reference)   */ Sources::kOutputsAndStream, Combine::kReplace, true, false, false, false, true, false, false, false},
    // The reference code's first_layer: from layer 2 on, a softmax mix of the
    // stream and layer 1's attention output replaces the input; before, the
    // input is the stream.  No gate, no null source.
    {Mode::kFirstLayer, "first_layer", /* (reference)       */ Sources::kStreamAndA1, Combine::kReplace, true,  false, false, true,  true,  false, false, false},
    // The reference code's delta_v: delta's additive routing over the
    // sublayer outputs (not e), and a third router per attention sublayer
    // (sharing its null source and gate) whose input feeds only the value
    // projection; Q and K read the usual routed input.
    {Mode::kDeltaV,     "delta_v",     /* (reference)       */ Sources::kSublayerOutputs, Combine::kAdd, true,  false, true,  true,  true,  false, true, false},
    // The reference code's full_v: routing over the stream after each
    // sublayer so far and the current stream (the last state, listed twice),
    // replacing the input, with delta_v's value router; the stream adds each
    // output and the final norm reads it.
    {Mode::kFullV,      "full_v",      /* (reference)       */ Sources::kCumulativeStates, Combine::kReplace, true, false, false, true, true, false, true, false},
    // The reference code's pre_gated: delta_v's sources (the outputs, not e),
    // each multiplied by a per-router gate σ(x·Wᵀ + b) before the softmax
    // (the keys normalised from the gated values), added to the stream.
    // No gate after it, no null source.
    {Mode::kPreGated,   "pre_gated",   /* (reference)       */ Sources::kSublayerOutputs, Combine::kAdd, true,  false, false, true,  true,  false, false, true},
};

inline constexpr size_t kNumModes = sizeof(kModeSpecs) / sizeof(kModeSpecs[0]);

// The row of each mode.  A switch with no default: a Mode added to the enum
// and left out here is a compile error (-Wswitch), and the static_assert
// holds every row to its place.
constexpr size_t mode_row(Mode m) {
  switch (m) {
    case Mode::kBaseline: return 0;
    case Mode::kBlock: return 1;
    case Mode::kFull: return 2;
    case Mode::kDelta: return 3;
    case Mode::kDeltaBlock: return 4;
    case Mode::kBlockAdd: return 5;
    case Mode::kFullAdditive: return 6;
    case Mode::kDeltaReplace: return 7;
    case Mode::kFirstLayer: return 8;
    case Mode::kDeltaV: return 9;
    case Mode::kFullV: return 10;
    case Mode::kPreGated: return 11;
  }
  return kNumModes;
}
constexpr bool rows_in_place() {
  for (size_t i = 0; i < kNumModes; ++i)
    if (mode_row(kModeSpecs[i].mode) != i) return false;
  return true;
}
static_assert(rows_in_place(), "kModeSpecs: one row per Mode, at the index mode_row gives");

inline const ModeSpec& mode_spec(Mode m) { return kModeSpecs[mode_row(m)]; }

// An input x + g·R that the backward rebuilds needs the stream x again: the
// backward sums it from the router's sources (model.cpp,
// sublayer_input_recompute_), which holds when they are e and every output so
// far.  (A replacing router beside a stream, delta_replace, rebuilds R alone.)
constexpr bool rebuilt_streams_are_sums() {
  for (const ModeSpec& m : kModeSpecs)
    if (m.routed() && !m.stores_inputs && m.combine == Combine::kAdd && m.sources != Sources::kOutputs) return false;
  return true;
}
static_assert(rebuilt_streams_are_sums(), "kModeSpecs: a mode that adds to a stream and rebuilds its inputs routes over the outputs");

// Every name attnres_mode takes, a row each: the modes above (their own
// facts), then the reference code's multi-head names, each one of those modes
// with facts of its own (docs/DESIGN.md §2, "Multi-head routing"):
//   block_mh   block with 8 heads and NO final router: the final norm reads
//              the last partial block sum (the reference's Qwen3 does so);
//   full_mh    full with 8 heads;
//   delta_mh   delta_block with 8 heads, the null source always on and the
//              reference's block deltas (x − last block source).
struct ModeName {
  const char* name;
  Mode mode;              // the row of kModeSpecs it runs
  bool reference_mh;      // one of the reference's _mh names
  int64_t heads;          // attnres_num_heads where the config does not say
  bool final_router;      // the final norm reads a final router
  bool fixes_delta_keys;  // the null source on and the reference's block deltas, whatever the config says
};

inline constexpr ModeName kModeNames[] = {
    // name          mode               _mh    heads final  fixes
    {"baseline",    Mode::kBaseline,   false, 1,    false, false},
    {"block",       Mode::kBlock,      false, 1,    true,  false},
    {"full",        Mode::kFull,       false, 1,    true,  false},
    {"delta",       Mode::kDelta,      false, 1,    false, false},
    {"delta_block", Mode::kDeltaBlock, false, 1,    false, false},
    {"block_add",   Mode::kBlockAdd,   false, 1,    false, false},
    {"full_additive", Mode::kFullAdditive, false, 1,  false, false},
    {"delta_replace", Mode::kDeltaReplace, false, 1,  false, false},
    {"first_layer", Mode::kFirstLayer, false, 1,      false, false},
    {"delta_v",     Mode::kDeltaV,     false, 1,      false, false},
    {"full_v",      Mode::kFullV,      false, 1,      false, false},
    {"pre_gated",   Mode::kPreGated,   false, 1,      false, false},
    {"block_mh",    Mode::kBlock,      true,  8,    false, false},
    {"full_mh",     Mode::kFull,       true,  8,    true,  false},
    {"delta_mh",    Mode::kDeltaBlock, true,  8,    false, true},
};
inline std::span<const ModeName> mode_names() { return kModeNames; }

// The other names of the reference code's attnres_mode (its train_scratch.py
// offers them; docs/routing.md, "The reference code's
// other modes and gates", says what its modeling code computes for each),
// which attnres does not run: each refused by name, with what it is, rather
// than as an unknown name.
struct UnrunName {
  const char* name;
  const char* what;  // the rest of the error line
};
inline constexpr const char* kNoBranch =
    "the reference's training script lists it, but its modeling code has no branch for it: the layers run full's "
    "recurrence with no final router, so the head reads only the last MLP output";
inline constexpr UnrunName kUnrunModes[] = {
    {"block_v", "the reference's modeling code builds its value router but its attention never reads it: the model "
                "is block with unused v_res_* tensors (use attnres_mode block)"},
    {"delta_block_v", "the reference's modeling code never gives its routers a source: every router returns the "
                      "stream, a plain Qwen3 with unused routing tensors (use attnres_mode baseline)"},
    {"delta_centered_reset", "the reference's modeling code has no branch for it and runs full exactly, final router "
                             "included (use attnres_mode full)"},
    {"delta_sublayer", kNoBranch},
    {"delta_centered", kNoBranch},
    {"delta_centered_block", kNoBranch},
    {"delta_avg_block", "the reference's training script lists it, but no modeling file of it implements it: the "
                        "layers run full's recurrence with no final router, so the head reads only the last MLP "
                        "output"},
    {"delta_replace_block", kNoBranch},
};

// The first rows are the modes' own names, with their own facts.
constexpr bool own_names_in_place() {
  for (size_t i = 0; i < kNumModes; ++i) {
    const ModeName& n = kModeNames[i];
    const ModeSpec& m = kModeSpecs[i];
    if (n.mode != m.mode || n.reference_mh || n.heads != 1 || n.final_router != m.final_router || n.fixes_delta_keys)
      return false;
    for (size_t c = 0;; ++c) {
      if (n.name[c] != m.name[c]) return false;
      if (!n.name[c]) break;
    }
  }
  return true;
}
static_assert(own_names_in_place(), "kModeNames: the modes of kModeSpecs first, in its order, with its facts");

}  // namespace attnres

// cpu_level.h — the instruction-set levels our own kernels are compiled for,
// and the one chosen at start.
//
// One portable binary holds every kernel that is not a product (ATTNRES_
// KERNEL_OPS of op_list.h: norms, RoPE, attention's softmax, SwiGLU, routing,
// cross-entropy, AdamW…) three times, each copy compiled with its own flags
// (CMakeLists.txt, ATTNRES_ISA_LEVELS) into a namespace of its own:
//   x86-64   the baseline every x86-64 CPU has (SSE2: 4 float lanes, no FMA)
//   avx2     AVX2 + FMA (8 lanes, fused multiply-add)
//   avx512   AVX-512 F/BW/VL/DQ as well (16 lanes)
// The CPU's best level is taken unless ATTNRES_CPU_LEVEL (or Context's
// cpu_level) names a lower one, which tests use to run the per-op case tables
// at every level the machine has.  The products are not part of this: OpenBLAS
// and oneDNN choose their own kernels by the CPU.
//
// Results may differ between levels in the last bits (FMA contracts a·b + c
// into one rounding; wider vectors add a reduction's lanes in another order;
// glibc's vector exp/log differ per width), as they differ between BLAS
// kernels.  On one machine and one level they do not depend on --threads or on
// the number of MPI ranks (cpu_backend.h, "Determinism").
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace attnres {

enum class CpuLevel { kX86_64 = 0, kAvx2 = 1, kAvx512 = 2 };

const char* cpu_level_name(CpuLevel l);  // "x86-64", "avx2", "avx512"
// The best level this CPU (and its operating system) can run.
CpuLevel cpu_level_detected();
// Every level this CPU can run, lowest first.
std::vector<CpuLevel> cpu_levels_here();
// The level a backend runs: `request` when not empty, else $ATTNRES_CPU_LEVEL
// when set, else the detected one.  An unknown name, or a level above this
// CPU's, is an Error naming where it came from and what this CPU has.
CpuLevel choose_cpu_level(const std::string& request);

// Whether this CPU has VDPBF16PS (AVX512-BF16): the bf16 products of our own
// kernels (skinny products, attention's avx512-bf16 tile path) use it where it is.
bool cpu_has_dpbf16();

// What runs the tile interface of attention's bf16 products (tiles.h):
//   amx          the AMX tiles (TDPBF16PS): a CPU reporting AMX-TILE and
//                AMX-BF16 whose kernel grants the process the tile state
//                (arch_prctl ARCH_REQ_XCOMP_PERM), at the avx512 level;
//   avx512-bf16  the same tile products as VDPBF16PS (AVX512-BF16), avx512 level;
//   float        the same tile products in float arithmetic (every level).
// The best path a level has here is taken unless ATTNRES_ATTENTION_TILES
// names a lower one (tests run every path this way).
enum class TilePath { kFloat = 0, kAvx512Bf16 = 1, kAmx = 2 };
const char* tile_path_name(TilePath p);  // "float", "avx512-bf16", "amx"
// The best path kernels of `level` can take on this CPU.  The first call that
// finds AMX asks the kernel for the tile state; a refusal is one line on
// stderr saying why, and the path is avx512-bf16.
TilePath tile_path_detected(CpuLevel level);
// Every path kernels of `level` can take here, lowest first.
std::vector<TilePath> tile_paths_here(CpuLevel level);
// $ATTNRES_ATTENTION_TILES when set, else tile_path_detected(level); an
// unknown name, or a path above what this CPU and level have, is an Error.
TilePath choose_tile_path(CpuLevel level);

}  // namespace attnres

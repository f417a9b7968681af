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

}  // namespace attnres

// kernels.cpp — the factory of one level's kernels (cpu_backend.h): compiled
// once per level, like every kernel file, into that level's namespace.
#include "ops/cpu/cpu_backend.h"

#include "ops/cpu/isa_begin.h"  // compiled for this copy's level (cpu_level.h)

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

std::unique_ptr<CpuBackend> make_cpu_kernels(Context& ctx) { return std::make_unique<CpuKernels>(ctx); }

}  // namespace attnres::ATTNRES_ISA

#include "ops/cpu/isa_end.h"

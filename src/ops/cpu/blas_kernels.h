// blas_kernels.h — making OpenBLAS use the kernels this CPU can run.
//
// OpenBLAS (Debian's is built with DYNAMIC_ARCH) picks its kernels when the
// library loads, from the CPU's family and model numbers.  Virtual machines
// that mask those (the CPU calls itself "Intel Xeon Processor") get the
// generic Prescott (SSE3) kernels: on this project's 2-core AVX-512 Xeon,
// SGEMM 2048³ runs at 54 GFLOP/s with them and at 210 with the Cooperlake
// ones.  The only way to choose is the OPENBLAS_CORETYPE variable, read at
// load time, so the program restarts itself once with it set.
#pragma once

#include <string>

#include "core/precision.h"

namespace attnres {

// If OpenBLAS chose a generic core although the CPU has AVX2/AVX-512, and the
// user did not set OPENBLAS_CORETYPE, sets it to the best matching core
// (Cooperlake: AVX-512 BF16; SkylakeX: AVX-512; Haswell: AVX2 + FMA) and
// re-executes the program with the same arguments; returns only when nothing
// needs doing (or the restart failed).  Call first thing in main().
void use_best_blas_kernels(char** argv);

// The kernels OpenBLAS runs here ("Haswell", "SkylakeX", …).
std::string openblas_core();

// This machine's SGEMM rate on 2048³ with `threads` threads, best of three
// (about a third of a second): the peak that fp32 MFU figures are measured against.
double measure_sgemm_gflops(int threads);  // measured once per thread count and process

// The peak of products in precision p that MFU is against: the float32
// products' library (cpu_backend.h, Fp32Gemm: oneDNN's matmul, or SGEMM), or
// oneDNN's bf16 matmul, on 2048³, once per precision, thread count and process.
double measure_peak_gflops(Precision p, int threads);
// What that peak is of, in words ("float32 matmul (oneDNN)", …).
const char* peak_name(Precision p);

}  // namespace attnres

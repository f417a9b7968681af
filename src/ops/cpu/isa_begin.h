// isa_begin.h — included by each kernel file after its other includes: what
// follows, up to isa_end.h, is compiled for the level this copy of the file
// is built for (ATTNRES_ISA_AVX2 / ATTNRES_ISA_AVX512, set by CMakeLists.txt;
// neither: the x86-64 baseline).  See cpu_level.h.
//
// The level is a target pragma around our code, not a flag for the whole file:
// what the headers above define (std::ostringstream, error.h's cat(), inline
// helpers), and the templates instantiated from them, stay baseline code.  The
// linker keeps one copy of such a function for the whole program, and a flag
// would let it keep the AVX-512 one for every level (test
// build.isa_kernels_keep_to_their_level_*).  The functions defined below, and the
// OpenMP regions inside them, take the level's instructions.
// No include guard: every kernel file includes it once.
#if defined(__clang__)
#if defined(ATTNRES_ISA_AVX512)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))), \
                             apply_to = function)
#elif defined(ATTNRES_ISA_AVX2)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#endif
#else
#pragma GCC push_options
#if defined(ATTNRES_ISA_AVX512)
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")
#elif defined(ATTNRES_ISA_AVX2)
#pragma GCC target("avx2,fma")
#endif
#endif

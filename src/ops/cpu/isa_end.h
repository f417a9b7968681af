// isa_end.h — closes isa_begin.h at the end of a kernel file.
#if defined(__clang__)
#if defined(ATTNRES_ISA_AVX512) || defined(ATTNRES_ISA_AVX2)
#pragma clang attribute pop
#endif
#else
#pragma GCC pop_options
#endif

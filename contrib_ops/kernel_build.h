// The start of every kernel file that CMakeLists.txt compiles once per ISA (ORTSERVE_ISA = avx512,
// avx2 or generic, each with its own -m flags); the op picks a build at run time (isa.h).
#pragma once

#ifndef ORTSERVE_ISA
#error "compile with -DORTSERVE_ISA=avx512|avx2|generic"
#endif

#define ALWAYS_INLINE inline __attribute__((always_inline))

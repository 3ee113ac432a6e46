// Eigen for ldlm's headers, included through here so that its AVX-512 code does not
// flood the build of anyone compiling ldlm with GCC 12 and -march=native.
#pragma once

// GCC 12 reports the deliberately undefined operand of its AVX-512 intrinsics
// (`__m512 __Y = __Y;` in _mm512_undefined_ps and its siblings) as used or maybe used
// uninitialized once an intrinsic is inlined, hundreds of times in Eigen's packet math
// (ptranspose, pmin/pmax) and its callers; GCC 13 does not (PR 105593). That both are
// system headers does not silence them. GCC looks such a warning up in the pragma state
// at each location of its inlining chain, so the region below covers every chain that
// passes through Eigen, or through the intrinsics headers when Eigen is the first to
// include them, whatever code it ends in; a chain within ldlm's own code is still checked.
// The region does not survive a precompiled header in GCC 12 (tests/CMakeLists.txt).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#define LDLM_EIGEN_GCC12_REGION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>
#include <unsupported/Eigen/SpecialFunctions>

#ifdef LDLM_EIGEN_GCC12_REGION
#pragma GCC diagnostic pop
#undef LDLM_EIGEN_GCC12_REGION
#endif

# Helpers for ldlm's own executables (tests, benchmarks, examples, the CLI).
# Not installed: consumers of ldlm::ldlm never see these flags.
include_guard(GLOBAL)

# ldlm_setup_executable(<target>)
#   Links ldlm::ldlm and applies the project's compile settings: C++20,
#   -Wall -Wextra -Wpedantic, and -march=native when LDLM_NATIVE is ON.
function(ldlm_setup_executable target)
  target_link_libraries(${target} PRIVATE ldlm::ldlm)
  target_compile_features(${target} PRIVATE cxx_std_20)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic)
    if(LDLM_NATIVE)
      target_compile_options(${target} PRIVATE -march=native)
      if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
        # GCC 12 false positive (PR 105593): Eigen's AVX-512 GEMM packing makes
        # avx512fintrin.h report -Wmaybe-uninitialized hundreds of times.
        target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
      endif()
    endif()
  elseif(MSVC)
    target_compile_options(${target} PRIVATE /W4 /permissive-)
  endif()
endfunction()

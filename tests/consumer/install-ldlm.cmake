# cmake -P script run by the ldlm_consumer_install test (fixture setup):
# configures ldlm's source tree afresh with only the library, then installs it
# into PREFIX. The layers are header-only; ldlm::text is compiled once here.
#
# Inputs (-D): LDLM_SOURCE_DIR, WORK_DIR, PREFIX, GENERATOR, CXX_COMPILER, USE_ONEDNN
foreach(var LDLM_SOURCE_DIR WORK_DIR PREFIX GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install-ldlm.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT DEFINED USE_ONEDNN)
  set(USE_ONEDNN OFF)
endif()

file(REMOVE_RECURSE "${WORK_DIR}" "${PREFIX}")

set(configure_args
  -S "${LDLM_SOURCE_DIR}" -B "${WORK_DIR}" -G "${GENERATOR}"
  # No build type (plain -O0), as the other consumers: the package is under test, not
  # its speed, and ldlm::text compiles in 35 s of CPU instead of 59 s at -O3.
  "-DCMAKE_BUILD_TYPE="
  "-DCMAKE_INSTALL_PREFIX=${PREFIX}"
  -DLDLM_BUILD_TESTS=OFF
  -DLDLM_BUILD_BENCHMARKS=OFF
  -DLDLM_BUILD_EXAMPLES=OFF
  -DLDLM_BUILD_TOOLS=OFF
  -DLDLM_BUILD_PYTHON=OFF
  -DLDLM_NATIVE=OFF
  "-DLDLM_USE_ONEDNN=${USE_ONEDNN}")
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()

function(run)
  string(JOIN " " printable ${ARGN})
  message(STATUS "+ ${printable}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${printable}")
  endif()
endfunction()

run("${CMAKE_COMMAND}" ${configure_args})
run("${CMAKE_COMMAND}" --build "${WORK_DIR}")
run("${CMAKE_COMMAND}" --install "${WORK_DIR}")

foreach(f include/ldlm/ldlm.hpp include/ldlm/io/tokenizer.hpp lib/cmake/ldlm/ldlmConfig.cmake
          lib/cmake/ldlm/ldlmConfigVersion.cmake lib/cmake/ldlm/ldlmTargets.cmake lib/libldlm_text.a
          lib/cmake/ldlm/ldlmFindPCRE2.cmake share/ldlm/gpt2/encoder.json share/ldlm/gpt2/vocab.bpe
          share/ldlm/gpt2/LICENSE share/ldlm/ldlm-demo.safetensors include/ldlm/text_model.hpp)
  if(NOT EXISTS "${PREFIX}/${f}")
    message(FATAL_ERROR "install-ldlm.cmake: ${PREFIX}/${f} was not installed")
  endif()
endforeach()
if(EXISTS "${PREFIX}/include/ldlm/text_model_impl.hpp")
  message(FATAL_ERROR "install-ldlm.cmake: text_model_impl.hpp was installed; it is compiled into ldlm::text")
endif()
message(STATUS "ldlm installed into ${PREFIX}")

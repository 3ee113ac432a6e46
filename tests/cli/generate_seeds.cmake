# `ldlm generate` is reproducible: the same seed twice (once to stdout, once with
# --output) gives identical token ids, a different seed gives different ones.
#   cmake -DLDLM=<exe> -DCONFIG=<config.json> -DOUT=<dir> -P generate_seeds.cmake
foreach(var LDLM CONFIG OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "generate_seeds.cmake: -D${var}=... is required")
  endif()
endforeach()
file(MAKE_DIRECTORY "${OUT}")
# model_small architecture with generator weights; B = 2 so that the sequences
# themselves show the seed (random weights give one token per sequence).
set(common --config "${CONFIG}" --batch 2 --length 16 --steps 4 --threads 1)

function(run_generate result)
  execute_process(COMMAND "${LDLM}" generate ${common} ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ldlm generate ${common} ${ARGN} failed (exit ${rc}):\n${out}${err}")
  endif()
  set(${result} "${out}" PARENT_SCOPE)
endfunction()

run_generate(first --seed 1)
file(REMOVE "${OUT}/tokens.txt")
run_generate(ignored --seed 1 --output "${OUT}/tokens.txt")
file(READ "${OUT}/tokens.txt" second)
run_generate(other --seed 2)
message("seed 1:\n${first}seed 1 (--output):\n${second}seed 2:\n${other}")

set(line "[0-9]+( [0-9]+)*\n")
if(NOT first MATCHES "^${line}${line}$")
  message(FATAL_ERROR "expected two lines of 16 space-separated token ids, got:\n${first}")
endif()
if(NOT ignored STREQUAL "")
  message(FATAL_ERROR "with --output nothing must go to stdout, got:\n${ignored}")
endif()
if(NOT first STREQUAL second)
  message(FATAL_ERROR "the same seed gave different tokens")
endif()
if(first STREQUAL other)
  message(FATAL_ERROR "seeds 1 and 2 gave identical tokens")
endif()

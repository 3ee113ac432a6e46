# `ldlm quantize` writes the built-in demo model as a quantized checkpoint. Generating
# from it at int8 gives the demo model's int8 ids exactly (quantized once = quantized
# at load); at bf16 it runs on the dequantized weights; quantizing it again is refused.
# Without int8 instructions the int8 comparison is skipped (CTest SKIP_REGULAR_EXPRESSION).
#   cmake -DLDLM=<exe> -DOUT=<dir> -P quantize.cmake
foreach(var LDLM OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "quantize.cmake: -D${var}=... is required")
  endif()
endforeach()
file(MAKE_DIRECTORY "${OUT}")
set(file "${OUT}/demo-int8.safetensors")
file(REMOVE "${file}")

function(run result)
  execute_process(COMMAND "${LDLM}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ldlm ${ARGN} failed (exit ${rc}):\n${out}${err}")
  endif()
  set(${result} "${out}" PARENT_SCOPE)
endfunction()

run(written quantize "${file}")
message("${written}")
if(NOT written MATCHES "^wrote .*demo-int8.safetensors: [0-9]+ parameters quantized to int8, [0-9.]+ MB\n$")
  message(FATAL_ERROR "unexpected report of ldlm quantize:\n${written}")
endif()

set(common generate --length 24 --batch 2 --steps 6 --seed 3 --threads 2 --ids)
run(dequantized ${common} --precision bf16 --weights "${file}")

execute_process(COMMAND "${LDLM}" quantize "${OUT}/again.safetensors" --weights "${file}"
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "is quantized already")
  message(FATAL_ERROR "quantizing a quantized file must be refused, got exit ${rc}:\n${err}")
endif()

execute_process(COMMAND "${LDLM}" ${common} --precision int8
  RESULT_VARIABLE rc OUTPUT_VARIABLE at_load ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  if(err MATCHES "int8 products need")
    message("SKIPPED: ${err}")
    return()
  endif()
  message(FATAL_ERROR "ldlm ${common} --precision int8 failed (exit ${rc}):\n${err}")
endif()
run(stored ${common} --precision int8 --weights "${file}")
message("int8, quantized at load:\n${at_load}int8, from the quantized file:\n${stored}")
if(NOT stored STREQUAL at_load)
  message(FATAL_ERROR "the quantized file gave other ids than quantizing at load")
endif()

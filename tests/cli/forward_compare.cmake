# Runs `ldlm forward MODULE` on a reference model directory, then `ldlm compare`
# against <MODULE>.outputs.safetensors.
#   cmake -DLDLM=<exe> -DMODULE=<name> -DDATA=<model dir> -DOUT=<dir> -DATOL=<a> -DRTOL=<r>
#         [-DWEIGHTS=<file>] [-DCONFIG=<file>] -P forward_compare.cmake
# WEIGHTS defaults to DATA/weights.safetensors; --config CONFIG is passed only when given
# (a self-describing weights file needs none).
foreach(var LDLM MODULE DATA OUT ATOL RTOL)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "forward_compare.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED WEIGHTS)
  set(WEIGHTS "${DATA}/weights.safetensors")
endif()
set(config_option)
if(DEFINED CONFIG)
  set(config_option --config "${CONFIG}")
endif()

file(MAKE_DIRECTORY "${OUT}")
set(output "${OUT}/${MODULE}.out.safetensors")
file(REMOVE "${output}")

execute_process(
  COMMAND "${LDLM}" forward "${MODULE}"
    --weights "${WEIGHTS}"
    --inputs "${DATA}/${MODULE}.inputs.safetensors"
    --output "${output}"
    ${config_option}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ldlm forward ${MODULE} failed (exit ${rc}):\n${out}${err}")
endif()

execute_process(
  COMMAND "${LDLM}" compare "${output}" "${DATA}/${MODULE}.outputs.safetensors" --atol "${ATOL}" --rtol "${RTOL}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ldlm compare ${MODULE} failed (exit ${rc})")
endif()

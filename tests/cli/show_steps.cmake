# `ldlm generate|infill --show-steps` with stderr not a terminal: exactly STEPS x SAMPLES
# lines "step i/STEPS t=T [sample b] TEXT" in order, each TEXT matching LINE, then the
# timing summary; stdout is the same as without --show-steps, and --quiet leaves stderr
# empty.
#   cmake -DLDLM=<exe> "-DARGS=a|b|c" -DSTEPS=<n> -DSAMPLES=<b> -DLINE=<regex> -P show_steps.cmake
# ARGS separates the arguments with '|' (a ';' would be split by add_test).
foreach(var LDLM ARGS STEPS SAMPLES LINE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "show_steps.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" arguments "${ARGS}")

function(run_ldlm out_var err_var)
  execute_process(COMMAND "${LDLM}" ${arguments} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ldlm ${arguments} ${ARGN} failed (exit ${rc}):\n${out}${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

run_ldlm(shown shown_err --show-steps)
run_ldlm(plain plain_err --quiet)
set(report "ldlm ${arguments} --show-steps\nstdout:\n${shown}stderr:\n${shown_err}\n--quiet, stdout:\n${plain}")
if(NOT shown STREQUAL plain)
  message(FATAL_ERROR "stdout differs with --show-steps\n${report}")
endif()
if(NOT plain_err STREQUAL "")
  message(FATAL_ERROR "with --quiet, stderr is not empty:\n${plain_err}\n${report}")
endif()

set(rest "${shown_err}")
foreach(step RANGE 1 ${STEPS})
  foreach(sample RANGE 1 ${SAMPLES})
    if(NOT rest MATCHES "^step ${step}/${STEPS} t=[0-9]+\\.[0-9]+ \\[sample ${sample}\\] ([^\n]*)\n")
      message(FATAL_ERROR "expected the line of step ${step}/${STEPS}, sample ${sample} here:\n${rest}\n${report}")
    endif()
    set(text "${CMAKE_MATCH_1}")
    string(LENGTH "${CMAKE_MATCH_0}" used)
    string(SUBSTRING "${rest}" ${used} -1 rest)
    if(NOT text MATCHES "^${LINE}$")
      message(FATAL_ERROR "step ${step}, sample ${sample}: '${text}' does not match '${LINE}'\n${report}")
    endif()
  endforeach()
endforeach()
# Then the timing summary and nothing else: no more step lines.
if(NOT rest MATCHES "^ldlm: load +[0-9.]+ ms\n(ldlm: [a-z]+ +[0-9.]+ ms[^\n]*\n)*ldlm: total [^\n]*tokens/s\n$")
  message(FATAL_ERROR "expected the timing summary after the step lines, got:\n${rest}\n${report}")
endif()
if(NOT rest MATCHES "\nldlm: preview +[0-9.]+ ms  ${STEPS} previews")
  message(FATAL_ERROR "the timing summary does not count ${STEPS} previews:\n${rest}\n${report}")
endif()
message("${report}")

# The built-in demo model (tools/assets/ldlm-demo) gives real text with no options:
# - `ldlm reconstruct --text S` prints S back;
# - `ldlm generate` prints words, and another seed prints other words.
#   cmake -DLDLM=<exe> -DTEXT=<sentence> -P demo_text.cmake
foreach(var LDLM TEXT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "demo_text.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run_ldlm result)
  execute_process(COMMAND "${LDLM}" ${ARGN} --threads 2
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ldlm ${ARGN} failed (exit ${rc}):\n${out}${err}")
  endif()
  set(${result} "${out}" PARENT_SCOPE)
endfunction()

run_ldlm(back reconstruct --text "${TEXT}")
message("reconstruct --text \"${TEXT}\":\n${back}")
if(NOT back STREQUAL "${TEXT}\n")
  message(FATAL_ERROR "the demo model did not give the sentence back:\n  sent: ${TEXT}\n  got:  ${back}")
endif()

run_ldlm(first generate --length 64 --seed 1)
run_ldlm(second generate --length 64 --seed 2)
message("generate --seed 1:\n${first}generate --seed 2:\n${second}")
foreach(sample IN ITEMS first second)
  string(REGEX MATCHALL "[A-Za-z]+" words "${${sample}}")
  list(LENGTH words count)
  if(count LESS 20)
    message(FATAL_ERROR "expected text of at least 20 words from 64 tokens, got ${count}:\n${${sample}}")
  endif()
endforeach()
if(first STREQUAL second)
  message(FATAL_ERROR "seeds 1 and 2 gave the same text")
endif()

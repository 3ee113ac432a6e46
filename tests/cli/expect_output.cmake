# Runs ldlm and checks that it succeeds and that stdout is exactly the bytes of
# EXPECT_FILE (no newline added or lost); STDIN, if given, is fed to it.
#   cmake -DLDLM=<exe> "-DARGS=a|b|c" -DEXPECT_FILE=<file> -DOUT=<file> [-DSTDIN=<file>]
#         -P expect_output.cmake
# ARGS separates the arguments with '|' (a ';' would be split by add_test).
foreach(var LDLM EXPECT_FILE OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "expect_output.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" arguments "${ARGS}")
set(input)
if(DEFINED STDIN)
  set(input INPUT_FILE "${STDIN}")
endif()
get_filename_component(out_dir "${OUT}" DIRECTORY)
file(MAKE_DIRECTORY "${out_dir}")
execute_process(COMMAND "${LDLM}" ${arguments} ${input}
  RESULT_VARIABLE rc OUTPUT_FILE "${OUT}" ERROR_VARIABLE err)
file(READ "${OUT}" out)
set(report "ldlm ${arguments}\nexit: ${rc}\nstdout (in ${OUT}):\n${out}\nstderr:\n${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ldlm failed\n${report}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -E compare_files "${OUT}" "${EXPECT_FILE}" RESULT_VARIABLE differ)
if(differ)
  file(READ "${EXPECT_FILE}" expected)
  message(FATAL_ERROR "stdout differs from ${EXPECT_FILE}, which holds:\n${expected}\n${report}")
endif()
message("${report}")

# Runs ldlm with arguments that must fail and checks the exit status and the
# message: stderr must be one "ldlm: error: ..." report (no crash, no stack trace)
# matching EXPECT_STDERR; EXPECT_STDOUT, if given, must match stdout.
#   cmake -DLDLM=<exe> "-DARGS=a|b|c" -DEXPECT_CODE=<n> [-DEXPECT_STDERR=<regex>] [-DEXPECT_STDOUT=<regex>]
#         [-DERROR_PREFIX=<regex>] [-DEXPECT_ABSENT=<path>] [-DSTDIN=<file>] -P expect_failure.cmake
# ARGS separates the arguments with '|' (a ';' would be split by add_test).
# Other tools use it too: ERROR_PREFIX replaces "ldlm: error: " (e.g. "convert: error: "
# for tools/convert.py), and a Python traceback counts as a crash. EXPECT_ABSENT names a
# file the command must not have created.
foreach(var LDLM EXPECT_CODE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "expect_failure.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" arguments "${ARGS}")
set(input)
if(DEFINED STDIN)
  set(input INPUT_FILE "${STDIN}")
endif()

execute_process(COMMAND "${LDLM}" ${arguments} ${input}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(report "ldlm ${arguments}\nexit: ${rc}\nstdout:\n${out}\nstderr:\n${err}")

if(NOT "${rc}" STREQUAL "${EXPECT_CODE}")
  message(FATAL_ERROR "expected exit status ${EXPECT_CODE}\n${report}")
endif()
if(err MATCHES "terminate called|Aborted|Segmentation|AddressSanitizer|runtime error|Traceback \\(most recent call last\\)")
  message(FATAL_ERROR "ldlm crashed instead of reporting an error\n${report}")
endif()
if(NOT DEFINED ERROR_PREFIX)
  set(ERROR_PREFIX "ldlm: error: ")
endif()
if(DEFINED EXPECT_STDERR)
  if(NOT err MATCHES "^${ERROR_PREFIX}")
    message(FATAL_ERROR "stderr does not start with '${ERROR_PREFIX}'\n${report}")
  endif()
  if(NOT err MATCHES "${EXPECT_STDERR}")
    message(FATAL_ERROR "stderr does not match '${EXPECT_STDERR}'\n${report}")
  endif()
endif()
if(DEFINED EXPECT_ABSENT AND EXISTS "${EXPECT_ABSENT}")
  message(FATAL_ERROR "the command created ${EXPECT_ABSENT}\n${report}")
endif()
if(DEFINED EXPECT_STDOUT AND NOT out MATCHES "${EXPECT_STDOUT}")
  message(FATAL_ERROR "stdout does not match '${EXPECT_STDOUT}'\n${report}")
endif()
message("${report}")

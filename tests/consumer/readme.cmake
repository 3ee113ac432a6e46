# cmake -P script run by the ldlm_readme test: the README's code is code that works.
# - README.md has at most 200 lines.
# - Every ```cpp block is, byte for byte, a program of examples/ (built and run by the
#   examples' tests).
# - The ```cmake block, with examples/hello.cpp beside it, is a project: it is
#   configured against the installed package (the ldlm_consumer_install fixture),
#   built, and run.
#
# Inputs (-D): LDLM_SOURCE_DIR, WORK_DIR, PREFIX, GENERATOR, CXX_COMPILER
cmake_minimum_required(VERSION 3.21)  # the policies of a script: while(TRUE), if() on numbers
foreach(var LDLM_SOURCE_DIR WORK_DIR PREFIX GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "readme.cmake: ${var} is not set")
  endif()
endforeach()

file(READ "${LDLM_SOURCE_DIR}/README.md" readme)
string(REGEX MATCHALL "\n" newlines "${readme}")
list(LENGTH newlines lines)
if(lines GREATER 200)
  message(FATAL_ERROR "readme.cmake: README.md has ${lines} lines; the front page keeps to 200")
endif()

# The fenced blocks of `language`, in order, into the list variable `out` (each block's
# semicolons escaped, so that the list keeps them).
function(fenced_blocks language out)
  set(blocks "")
  set(rest "${readme}")
  while(TRUE)
    string(FIND "${rest}" "\n```${language}\n" start)
    if(start EQUAL -1)
      break()
    endif()
    string(LENGTH "\n```${language}\n" fence)
    math(EXPR start "${start} + ${fence}")
    string(SUBSTRING "${rest}" ${start} -1 rest)
    string(FIND "${rest}" "\n```\n" end)
    if(end EQUAL -1)
      message(FATAL_ERROR "readme.cmake: a ```${language} block of README.md is not closed")
    endif()
    math(EXPR end "${end} + 1")
    string(SUBSTRING "${rest}" 0 ${end} block)
    string(SUBSTRING "${rest}" ${end} -1 rest)
    string(REPLACE ";" "\\;" block "${block}")
    list(APPEND blocks "${block}")
  endwhile()
  set(${out} "${blocks}" PARENT_SCOPE)
endfunction()

fenced_blocks(cpp cpp_blocks)
list(LENGTH cpp_blocks cpp_count)
if(cpp_count EQUAL 0)
  message(FATAL_ERROR "readme.cmake: README.md has no ```cpp block (its hello world is examples/hello.cpp)")
endif()
file(GLOB examples "${LDLM_SOURCE_DIR}/examples/*.cpp")
foreach(block IN LISTS cpp_blocks)
  set(found "")
  foreach(example IN LISTS examples)
    file(READ "${example}" text)
    if(text STREQUAL block)
      set(found "${example}")
    endif()
  endforeach()
  if(NOT found)
    string(SUBSTRING "${block}" 0 200 head)
    message(FATAL_ERROR "readme.cmake: this ```cpp block of README.md is not a file of examples/ "
                        "(copy the example verbatim, or make it one):\n${head}...")
  endif()
  message(STATUS "README's ```cpp block is ${found}")
endforeach()

fenced_blocks(cmake cmake_blocks)
list(LENGTH cmake_blocks cmake_count)
if(NOT cmake_count EQUAL 1)
  message(FATAL_ERROR "readme.cmake: README.md has ${cmake_count} ```cmake blocks, expected the one of 'Use from C++'")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/src")
file(WRITE "${WORK_DIR}/src/CMakeLists.txt"
  "cmake_minimum_required(VERSION 3.25)\nproject(readme_hello LANGUAGES CXX)\n${cmake_blocks}")
file(COPY "${LDLM_SOURCE_DIR}/examples/hello.cpp" DESTINATION "${WORK_DIR}/src")

function(run)
  string(JOIN " " printable ${ARGN})
  message(STATUS "+ ${printable}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${printable}\n${output}")
  endif()
  set(output "${output}" PARENT_SCOPE)
endfunction()

set(configure_args -S "${WORK_DIR}/src" -B "${WORK_DIR}/build" -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${PREFIX}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
run("${CMAKE_COMMAND}" ${configure_args})
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/hello")
if(NOT output MATCHES "^The children played in the[^\n]* after school\\.\nThe old man")
  message(FATAL_ERROR "readme.cmake: the README's hello world printed:\n${output}")
endif()
message(STATUS "the README's hello world, built from its CMake lines, printed:\n${output}")

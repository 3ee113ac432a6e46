# ldlm_find_python(<found_var> <why_var>)
#   Looks for what the Python module (tools/python) needs: a Python 3 interpreter that
#   can import NumPy (the tests and the module's arrays need it), its development
#   files, and pybind11's CMake package (Debian: pybind11-dev). Sets <found_var> to
#   TRUE or FALSE and, when FALSE, <why_var> to what is missing. A macro: the packages'
#   variables (pybind11's module suffix, Python3_SITEARCH) must reach the caller.
#
#   The interpreter is chosen by a validator, not by the first `python3` on PATH: a
#   version manager's shim (pyenv) may come first without the distribution's NumPy,
#   and a module built for it would not import where the tests run. Pass
#   -DPython3_EXECUTABLE=... to choose another.
include_guard(GLOBAL)

function(_ldlm_python_imports_numpy result candidate)
  execute_process(COMMAND "${candidate}" -c "import numpy" RESULT_VARIABLE status OUTPUT_QUIET ERROR_QUIET)
  if(NOT status EQUAL 0)
    set(${result} FALSE PARENT_SCOPE)
  endif()
endfunction()

macro(ldlm_find_python found_var why_var)
  set(${found_var} FALSE)
  set(${why_var} "")
  if(NOT Python3_EXECUTABLE)
    find_program(LDLM_PYTHON3 NAMES python3 NAMES_PER_DIR VALIDATOR _ldlm_python_imports_numpy)
    mark_as_advanced(LDLM_PYTHON3)
    if(LDLM_PYTHON3)
      set(Python3_EXECUTABLE "${LDLM_PYTHON3}" CACHE FILEPATH "The Python 3 interpreter of the ldlm module")
    else()
      set(${why_var} "no python3 that imports NumPy was found (Debian: python3-numpy)")
    endif()
  endif()
  if(NOT ${why_var})
    find_package(Python3 COMPONENTS Interpreter Development.Module)
    if(NOT Python3_Development.Module_FOUND)
      set(${why_var} "the development files of Python 3 were not found (Debian: python3-dev)")
    endif()
  endif()
  if(NOT ${why_var})
    find_package(pybind11 2.10 CONFIG QUIET)
    if(pybind11_FOUND)
      set(${found_var} TRUE)
    else()
      set(${why_var} "pybind11 was not found (Debian: pybind11-dev)")
    endif()
  endif()
endmacro()

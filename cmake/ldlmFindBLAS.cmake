# Finds the BLAS that ldlm hands to Eigen (EIGEN_USE_BLAS) and provides the
# imported target BLAS::BLAS. Used by ldlm's own CMakeLists.txt and by the
# installed ldlmConfig.cmake, so both resolve the same library.
#
# Preference: OpenBLAS; on Debian the OpenMP build (libopenblas0-openmp, in
# /usr/lib/<multiarch>/openblas-openmp) is taken over the default pthread one
# when it is installed. Override with -DBLA_VENDOR=... or by setting
# BLAS_openblas_LIBRARY (or BLAS_LIBRARIES) to a library path yourself.
include_guard(GLOBAL)

macro(ldlm_find_blas)
  if(NOT DEFINED BLA_VENDOR)
    set(BLA_VENDOR OpenBLAS)
  endif()
  if(BLA_VENDOR STREQUAL "OpenBLAS" AND NOT DEFINED CACHE{BLAS_openblas_LIBRARY})
    set(_ldlm_blas_dirs)
    if(CMAKE_LIBRARY_ARCHITECTURE)
      list(APPEND _ldlm_blas_dirs "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
    endif()
    list(APPEND _ldlm_blas_dirs "/usr/lib/openblas-openmp" "/usr/lib64/openblas-openmp")
    foreach(_ldlm_dir IN LISTS _ldlm_blas_dirs)
      foreach(_ldlm_name IN ITEMS libopenblas.so libopenblas.so.0)
        if(EXISTS "${_ldlm_dir}/${_ldlm_name}")
          set(BLAS_openblas_LIBRARY "${_ldlm_dir}/${_ldlm_name}" CACHE FILEPATH
            "OpenBLAS library used by ldlm (OpenMP build preferred)")
          break()
        endif()
      endforeach()
      if(DEFINED CACHE{BLAS_openblas_LIBRARY})
        break()
      endif()
    endforeach()
    unset(_ldlm_blas_dirs)
    unset(_ldlm_dir)
    unset(_ldlm_name)
  endif()
  find_package(BLAS ${ARGN})
  if(BLAS_FOUND AND NOT TARGET BLAS::BLAS)
    # FindBLAS only defines BLAS::BLAS when it found libraries to link.
    add_library(BLAS::BLAS INTERFACE IMPORTED)
    set_target_properties(BLAS::BLAS PROPERTIES
      INTERFACE_LINK_LIBRARIES "${BLAS_LIBRARIES};${BLAS_LINKER_FLAGS}")
  endif()
endmacro()

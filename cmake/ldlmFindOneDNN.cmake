# Finds oneDNN (Debian: libdnnl-dev), the library behind ldlm's matrix products, and
# provides the imported target ldlm::onednn. Used by ldlm's own CMakeLists.txt and by
# the installed ldlmConfig.cmake, so both resolve the same library.
#
# oneDNN's own CMake package is not used: Debian's requires the OpenCL headers for
# its GPU runtime, which ldlm never touches. Override the search with
# -DLDLM_ONEDNN_INCLUDE_DIR=... -DLDLM_ONEDNN_LIBRARY=...
include_guard(GLOBAL)

macro(ldlm_find_onednn)
  find_path(LDLM_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp DOC "oneDNN include directory (oneapi/dnnl/dnnl.hpp)")
  find_library(LDLM_ONEDNN_LIBRARY NAMES dnnl DOC "oneDNN library (libdnnl)")
  if(LDLM_ONEDNN_INCLUDE_DIR AND LDLM_ONEDNN_LIBRARY)
    set(LDLM_ONEDNN_FOUND TRUE)
    if(NOT TARGET ldlm::onednn)
      add_library(ldlm::onednn INTERFACE IMPORTED)
      # dl: the OpenMP thread count is looked up with dlsym (ops/onednn.hpp).
      set_target_properties(ldlm::onednn PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${LDLM_ONEDNN_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${LDLM_ONEDNN_LIBRARY};${CMAKE_DL_LIBS}")
    endif()
  else()
    set(LDLM_ONEDNN_FOUND FALSE)
  endif()
endmacro()

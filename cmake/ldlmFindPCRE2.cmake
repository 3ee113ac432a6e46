# Finds PCRE2's 8-bit library, which the tokenizer (ldlm/io/tokenizer.hpp) uses for
# GPT-2's pre-tokenization pattern, and provides the imported target PCRE2::8BIT (the
# name of PCRE2's own CMake package from 10.43 on, so a target found that way is
# reused). Used by ldlm's CMakeLists.txt and by the installed ldlmConfig.cmake, so
# both resolve the same library. Debian: libpcre2-dev (10.40 or newer is needed for
# \p{White_Space}; the header checks the version).
#
# pkg-config's libpcre2-8 gives the hints; find_path/find_library also work without
# pkg-config. Override with -DLDLM_PCRE2_INCLUDE_DIR=... -DLDLM_PCRE2_LIBRARY=...
include_guard(GLOBAL)

macro(ldlm_find_pcre2)
  if(NOT TARGET PCRE2::8BIT)
    find_package(PkgConfig QUIET)
    if(PKG_CONFIG_FOUND)
      pkg_check_modules(_ldlm_pcre2 QUIET libpcre2-8)
    endif()
    find_path(LDLM_PCRE2_INCLUDE_DIR pcre2.h HINTS ${_ldlm_pcre2_INCLUDE_DIRS})
    find_library(LDLM_PCRE2_LIBRARY NAMES pcre2-8 HINTS ${_ldlm_pcre2_LIBRARY_DIRS})
    if(LDLM_PCRE2_INCLUDE_DIR AND LDLM_PCRE2_LIBRARY)
      add_library(PCRE2::8BIT UNKNOWN IMPORTED GLOBAL)
      set_target_properties(PCRE2::8BIT PROPERTIES
        IMPORTED_LOCATION "${LDLM_PCRE2_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${LDLM_PCRE2_INCLUDE_DIR}")
    endif()
  endif()
  if(TARGET PCRE2::8BIT)
    set(PCRE2_FOUND TRUE)
  else()
    set(PCRE2_FOUND FALSE)
  endif()
endmacro()

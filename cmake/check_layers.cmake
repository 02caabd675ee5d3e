# SPDX-License-Identifier: MIT
# The layer check: every '#include "..."' line of src/ and tools/ against the
# table of cmake/layers.cmake. A file may include its own folder's private
# headers, the public ones (megascope/...) but those its folder's
# MS_DENIES_<folder> names, and the private headers of the folders its
# folder's MS_SEES_<folder> names, and the core's (MS_SEEN_BY_ALL: every
# part's, unless what a core header brings is denied to the part); a folder
# with MS_PUBLIC_<folder> (the core) includes only those public headers; an
# include that climbs out of its folder ("../") is refused too, and so is
# a test of __CUDACC__ outside src/core/ (public headers included). The build runs it before compiling
# anything (target `layers`) and ctest runs it as the test `layers`.
#
#   cmake -DMS_SRC=<source dir> -P cmake/check_layers.cmake
#   cmake -DMS_SRC=<source dir> -DMS_FILES="a.c;b.c" -P ...   only these files
cmake_minimum_required(VERSION 3.20)
if(NOT MS_SRC)
  get_filename_component(MS_SRC "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
endif()
include(${MS_SRC}/cmake/layers.cmake)

file(GLOB MS_FOLDERS LIST_DIRECTORIES true RELATIVE ${MS_SRC}/src ${MS_SRC}/src/*)
if(NOT MS_FILES)
  file(GLOB_RECURSE MS_FILES ${MS_SRC}/src/*.c ${MS_SRC}/src/*.h ${MS_SRC}/src/*.cu ${MS_SRC}/src/*.cuh
                             ${MS_SRC}/tools/*.c ${MS_SRC}/tools/*.h)
endif()

# The public headers a core header brings, through the core headers it
# includes (MS_PUBLIC_core bounds them; a part's MS_DENIES holds against them).
function(ms_core_brings header out)
  set(todo ${header})
  set(seen)
  set(pub)
  while(todo)
    list(POP_FRONT todo h)
    if(h IN_LIST seen OR NOT EXISTS ${MS_SRC}/src/${h})
      continue()
    endif()
    list(APPEND seen ${h})
    file(STRINGS ${MS_SRC}/src/${h} ls REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(l ${ls})
      if(l MATCHES "#[ \t]*include[ \t]*\"(core/[^\"]+)\"")
        list(APPEND todo ${CMAKE_MATCH_1})
      elseif(l MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
        list(APPEND pub ${CMAKE_MATCH_1})
      endif()
    endforeach()
  endwhile()
  set(${out} ${pub} PARENT_SCOPE)
endfunction()

set(bad 0)
foreach(f ${MS_FILES})
  get_filename_component(f "${f}" ABSOLUTE BASE_DIR ${MS_SRC})
  file(RELATIVE_PATH rel ${MS_SRC} ${f})
  if(rel MATCHES "^src/([^/]+)/")
    set(part ${CMAKE_MATCH_1})
  elseif(rel MATCHES "^tools/")
    set(part tools)
  else()
    continue()  # tests/ and the rest: white-box, unchecked
  endif()
  file(STRINGS ${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line ${lines})
    if(NOT line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
      continue()
    endif()
    set(inc ${CMAKE_MATCH_1})
    if(inc MATCHES "(^|/)\\.\\.(/|$)")
      message(SEND_ERROR "${rel}: #include \"${inc}\" reaches out of src/${part}/ by a relative path")
      set(bad 1)
      continue()
    endif()
    if(inc IN_LIST MS_DENIES_${part})
      message(SEND_ERROR "${rel}: #include \"${inc}\" is above ${part} in the direction of flow "
                         "(cmake/layers.cmake, MS_DENIES_${part})")
      set(bad 1)
      continue()
    endif()
    if(NOT inc MATCHES "^([^/]+)/")
      continue()  # a header beside the file
    endif()
    set(owner ${CMAKE_MATCH_1})
    if(DEFINED MS_PUBLIC_${part} AND NOT owner IN_LIST MS_FOLDERS AND NOT inc IN_LIST MS_PUBLIC_${part})
      message(SEND_ERROR "${rel}: #include \"${inc}\": ${part} includes only its own headers and the public "
                         "headers MS_PUBLIC_${part} names (cmake/layers.cmake)")
      set(bad 1)
      continue()
    endif()
    if(owner IN_LIST MS_SEEN_BY_ALL AND NOT owner STREQUAL part)
      ms_core_brings(${inc} brought)
      foreach(b ${brought})
        if(b IN_LIST MS_DENIES_${part})
          message(SEND_ERROR "${rel}: #include \"${inc}\" brings \"${b}\", which is above ${part} in the "
                             "direction of flow (cmake/layers.cmake, MS_DENIES_${part})")
          set(bad 1)
        endif()
      endforeach()
      continue()  # the core: every part sees it
    endif()
    if(owner STREQUAL part OR NOT owner IN_LIST MS_FOLDERS)
      continue()  # its own folder, or a public header (megascope/...)
    endif()
    if(owner IN_LIST MS_SEES_${part})
      continue()
    endif()
    if(MS_SEES_${part})
      string(REPLACE ";" ", " sees "${MS_SEES_${part}}")
      set(sees "only the private headers of ${sees}")
    else()
      set(sees "no private header of another part")
    endif()
    message(SEND_ERROR "${rel}: #include \"${inc}\" is a private header of src/${owner}/, and ${part} may include "
                       "${sees} (cmake/layers.cmake, MS_SEES_${part}); use a public header of include/megascope/ "
                       "or add the edge to the table if the direction of flow allows it")
    set(bad 1)
  endforeach()
endforeach()
# Only the core asks which compiler it is under: a file elsewhere (a public
# header included) that tests __CUDACC__ is refused; the core's hostdev.h
# gives the qualifiers.
file(GLOB_RECURSE ms_public ${MS_SRC}/include/*.h)
foreach(f ${MS_FILES} ${ms_public})
  get_filename_component(f "${f}" ABSOLUTE BASE_DIR ${MS_SRC})
  file(RELATIVE_PATH rel ${MS_SRC} ${f})
  if(rel MATCHES "^src/core/" OR NOT rel MATCHES "^(src|tools|include)/")
    continue()
  endif()
  file(STRINGS ${f} cu REGEX "__CUDACC__")
  if(cu)
    message(SEND_ERROR "${rel}: tests __CUDACC__, which only src/core/ does (core/hostdev.h gives the qualifiers "
                       "of code compiled for host and device)")
    set(bad 1)
  endif()
endforeach()

if(bad)
  message(FATAL_ERROR "layers: includes against the direction of flow (docs/design.md, \"The direction of flow\")")
endif()

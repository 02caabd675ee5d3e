# SPDX-License-Identifier: MIT
# The layer check: every '#include "..."' line of src/, tools/ and the public
# headers (include/megascope/) against the table of cmake/layers.cmake. A file
# belongs to the part of its folder (src/<part>/, tools/ is the part `tools`; a
# public header to the part MS_OWNS_<part> names). It may include
#  - its own folder's private headers, and those of the folders its part's
#    MS_SEES_<part> names; any part may include src/core/'s (MS_SEEN_BY_ALL),
#    unless a public header the core header brings is denied to the part;
#  - a public header (megascope/...) whose owner is its own part or a part below
#    it (reached through MS_LINKS_<part>), and not one MS_DENIES_<part> names;
#    a public header no part owns, or two parts own, is refused too;
#  - nothing by a path that climbs out of its folder ("../").
# A part with MS_PUBLIC_<part> (the core) includes only those public headers,
# and only src/core/ tests __CUDACC__ (public headers included).
# Every include between two parts is an edge from the includer's part to the
# header's owner; a circle of such edges is refused, naming each edge in it.
# The build runs it before compiling anything
# (target `layers`) and ctest runs it as the test `layers`.
#
#   cmake -DMS_SRC=<source dir> -P cmake/check_layers.cmake
#   cmake -DMS_SRC=<source dir> -DMS_FILES="a.c;b.c" -P ...   only these files
cmake_minimum_required(VERSION 3.20)
if(NOT MS_SRC)
  get_filename_component(MS_SRC "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
endif()
include(${MS_SRC}/cmake/layers.cmake)

file(GLOB MS_FOLDERS LIST_DIRECTORIES true RELATIVE ${MS_SRC}/src ${MS_SRC}/src/*)
set(MS_PARTS ${MS_TARGETS} cuda tools)
if(NOT MS_FILES)
  file(GLOB_RECURSE MS_FILES ${MS_SRC}/src/*.c ${MS_SRC}/src/*.h ${MS_SRC}/src/*.cu ${MS_SRC}/src/*.cuh
                             ${MS_SRC}/tools/*.c ${MS_SRC}/tools/*.h ${MS_SRC}/include/megascope/*.h)
  set(all_files 1)
endif()

# The public headers a core header brings, through the core headers it
# includes (MS_PUBLIC_core bounds them; a part's MS_DENIES holds against them).
function(ms_core_brings header out)
  set(frontier ${header})
  set(seen)
  set(pub)
  while(frontier)
    list(POP_FRONT frontier h)
    if(h IN_LIST seen OR NOT EXISTS ${MS_SRC}/src/${h})
      continue()
    endif()
    list(APPEND seen ${h})
    file(STRINGS ${MS_SRC}/src/${h} ls REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(l ${ls})
      if(l MATCHES "#[ \t]*include[ \t]*\"(core/[^\"]+)\"")
        list(APPEND frontier ${CMAKE_MATCH_1})
      elseif(l MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
        list(APPEND pub ${CMAKE_MATCH_1})
      endif()
    endforeach()
  endwhile()
  set(${out} ${pub} PARENT_SCOPE)
endfunction()

set(bad 0)
macro(refuse)
  message(SEND_ERROR ${ARGN})
  set(bad 1)
endmacro()

# The owner of every public header, and each part's parts below it.
foreach(p ${MS_PARTS})
  foreach(h ${MS_OWNS_${p}})
    if(DEFINED owner_${h})
      refuse("include/${h}: owned by both ${owner_${h}} and ${p} (cmake/layers.cmake, MS_OWNS_${owner_${h}}, "
             "MS_OWNS_${p}); a public header has one owning part")
    endif()
    set(owner_${h} ${p})
  endforeach()
  set(below_${p})
  set(frontier ${MS_LINKS_${p}})
  while(frontier)
    list(POP_FRONT frontier q)
    if(NOT q IN_LIST below_${p})
      list(APPEND below_${p} ${q})
      list(APPEND frontier ${MS_LINKS_${q}})
    endif()
  endwhile()
endforeach()

set(edges)  # "from>to" between two parts, each with the first line that made it (why_<from>_<to>)
foreach(f ${MS_FILES})
  get_filename_component(f "${f}" ABSOLUTE BASE_DIR ${MS_SRC})
  file(RELATIVE_PATH rel ${MS_SRC} ${f})
  if(rel MATCHES "^src/([^/]+)/")
    set(part ${CMAKE_MATCH_1})
  elseif(rel MATCHES "^tools/")
    set(part tools)
  elseif(rel MATCHES "^include/(megascope/.+)$")
    set(part ${owner_${CMAKE_MATCH_1}})
    if(NOT part)
      refuse("${rel}: no part owns this public header (cmake/layers.cmake, MS_OWNS_<part>)")
      continue()
    endif()
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
      refuse("${rel}: #include \"${inc}\" reaches out of src/${part}/ by a relative path")
      continue()
    endif()
    if(inc IN_LIST MS_DENIES_${part})
      refuse("${rel}: #include \"${inc}\" is above ${part} in the direction of flow "
             "(cmake/layers.cmake, MS_DENIES_${part})")
      continue()
    endif()
    if(DEFINED MS_PUBLIC_${part} AND inc MATCHES "^megascope/")
      if(NOT inc IN_LIST MS_PUBLIC_${part})
        refuse("${rel}: #include \"${inc}\": ${part} includes only its own headers and the public "
               "headers MS_PUBLIC_${part} names (cmake/layers.cmake)")
      endif()
      continue()  # the core sits beside the flow: no edge
    endif()
    if(inc MATCHES "^megascope/")
      set(owner ${owner_${inc}})
      if(NOT owner)
        refuse("${rel}: #include \"${inc}\": no part owns this public header (cmake/layers.cmake, MS_OWNS_<part>)")
        continue()
      endif()
      if(NOT owner STREQUAL part AND NOT owner IN_LIST below_${part})
        refuse("${rel}: #include \"${inc}\" is the door of ${owner} (cmake/layers.cmake, MS_OWNS_${owner}), "
               "which is not below ${part} (MS_LINKS_${part}): a public header is included by its owner "
               "and the parts above it only")
        continue()
      endif()
    else()
      if(NOT inc MATCHES "^([^/]+)/")
        continue()  # a header beside the file
      endif()
      set(owner ${CMAKE_MATCH_1})
      if(owner IN_LIST MS_SEEN_BY_ALL AND NOT owner STREQUAL part)
        ms_core_brings(${inc} brought)
        foreach(b ${brought})
          if(b IN_LIST MS_DENIES_${part})
            refuse("${rel}: #include \"${inc}\" brings \"${b}\", which is above ${part} in the "
                   "direction of flow (cmake/layers.cmake, MS_DENIES_${part})")
          endif()
        endforeach()
        continue()  # the core: every part sees it
      endif()
      if(owner STREQUAL part OR NOT owner IN_LIST MS_FOLDERS)
        continue()  # its own folder, or not a folder of src/
      endif()
      if(NOT owner IN_LIST MS_SEES_${part})
        if(MS_SEES_${part})
          string(REPLACE ";" ", " sees "${MS_SEES_${part}}")
          set(sees "only the private headers of ${sees}")
        else()
          set(sees "no private header of another part")
        endif()
        refuse("${rel}: #include \"${inc}\" is a private header of src/${owner}/, and ${part} may include "
               "${sees} (cmake/layers.cmake, MS_SEES_${part}); use a public header of include/megascope/ "
               "or add the edge to the table if the direction of flow allows it")
        continue()
      endif()
    endif()
    if(NOT owner STREQUAL part AND NOT "${part}>${owner}" IN_LIST edges)
      list(APPEND edges "${part}>${owner}")
      set(why_${part}_${owner} "${rel}: #include \"${inc}\"")
    endif()
  endforeach()
endforeach()

# Circles between parts: an edge a -> b where a is reached again from b.
if(all_files)
  foreach(e ${edges})
    string(REPLACE ">" ";" ab "${e}")
    list(GET ab 0 a)
    list(GET ab 1 b)
    list(APPEND out_${a} ${b})
  endforeach()
  foreach(e ${edges})
    string(REPLACE ">" ";" ab "${e}")
    list(GET ab 0 a)
    list(GET ab 1 b)
    # a path b -> ... -> a, breadth first, remembering each part's predecessor
    set(seen ${b})
    set(frontier ${b})
    set(found 0)
    while(frontier AND NOT found)
      list(POP_FRONT frontier x)
      foreach(y ${out_${x}})
        if(NOT y IN_LIST seen)
          list(APPEND seen ${y})
          list(APPEND frontier ${y})
          set(prev_${y} ${x})
          if(y STREQUAL a)
            set(found 1)
          endif()
        endif()
      endforeach()
    endwhile()
    if(found)
      set(path "${a} -> ${b}")
      set(steps "${why_${a}_${b}}")
      set(x ${a})
      set(chain)
      while(NOT x STREQUAL b)
        list(PREPEND chain ${x})
        set(x ${prev_${x}})
      endwhile()
      set(x ${b})
      foreach(y ${chain})
        string(APPEND path " -> ${y}")
        string(APPEND steps ", then ${why_${x}_${y}}")
        set(x ${y})
      endforeach()
      refuse("${why_${a}_${b}} closes a circle between parts (${path}): ${steps}")
    endif()
  endforeach()
endif()
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
    refuse("${rel}: tests __CUDACC__, which only src/core/ does (core/hostdev.h gives the qualifiers "
           "of code compiled for host and device)")
  endif()
endforeach()

if(bad)
  message(FATAL_ERROR "layers: includes against the direction of flow (docs/design.md, \"The direction of flow\")")
endif()

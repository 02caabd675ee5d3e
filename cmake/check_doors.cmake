# SPDX-License-Identifier: MIT
# The doors check: every function a public header declares is defined in the
# library of the part that owns the header (cmake/layers.cmake, MS_OWNS_<part>).
# The C compiler lists each header's declarations (-aux-info), nm each
# library's defined symbols; a function declared and not defined by its owner
# is refused, naming the header's line, the function, the rule and where it
# is defined instead. ctest runs it as the test `doors`, after the libraries
# are built.
#
#   cmake -DMS_SRC=<source dir> -DMS_CC=<cc> -DMS_NM=<nm>
#         -DMS_LIBS="base=<libms_base.a>|model=<libms_model.a>|..." -P cmake/check_doors.cmake
cmake_minimum_required(VERSION 3.20)
include(${MS_SRC}/cmake/layers.cmake)
set(work ${CMAKE_CURRENT_BINARY_DIR}/doors.tmp)
file(MAKE_DIRECTORY ${work})

# Each library's defined (global) functions: defs_<part>.
string(REPLACE "|" ";" libs "${MS_LIBS}")
set(parts)
foreach(pl ${libs})
  string(REGEX MATCH "^([^=]+)=(.*)$" _ "${pl}")
  set(p ${CMAKE_MATCH_1})
  set(lib_${p} ${CMAKE_MATCH_2})
  list(APPEND parts ${p})
  execute_process(COMMAND ${MS_NM} -g -P --defined-only ${lib_${p}} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "doors: ${MS_NM} ${lib_${p}} failed")
  endif()
  string(REGEX MATCHALL "(^|\n)[A-Za-z_][A-Za-z0-9_]* [TW]" syms "${out}")
  list(TRANSFORM syms REPLACE "^\n?([A-Za-z0-9_]+) [TW]$" "\\1")
  set(defs_${p} ${syms})
endforeach()

string(REGEX REPLACE "([][+.*()^$?|\\])" "\\\\\\1" src_re "${MS_SRC}")
set(bad 0)
set(n_checked 0)
foreach(p ${parts})
  foreach(h ${MS_OWNS_${p}})
    file(WRITE ${work}/door.c "#include \"${h}\"\n")
    execute_process(COMMAND ${MS_CC} -D_GNU_SOURCE -std=gnu11 -I${MS_SRC}/include -fsyntax-only
                            -aux-info ${work}/door.aux ${work}/door.c
                    RESULT_VARIABLE rc ERROR_VARIABLE err)
    if(rc)
      message(SEND_ERROR "include/${h}: does not compile alone as C: ${err}")
      set(bad 1)
      continue()
    endif()
    file(STRINGS ${work}/door.aux decls REGEX "^/\\* ${src_re}/include/${h}:[0-9]+:[NO]C \\*/ extern ")
    foreach(d ${decls})
      string(REGEX MATCH ":([0-9]+):" _ "${d}")
      set(line ${CMAKE_MATCH_1})
      string(REGEX REPLACE "^/\\*[^*]*\\*/ extern " "" d "${d}")
      if(d MATCHES "\\(\\*([A-Za-z_][A-Za-z0-9_]*) \\(")      # a function returning a function pointer
        set(fn ${CMAKE_MATCH_1})
      elseif(d MATCHES "([A-Za-z_][A-Za-z0-9_]*) \\(")
        set(fn ${CMAKE_MATCH_1})
      else()
        continue()
      endif()
      math(EXPR n_checked "${n_checked} + 1")
      if(fn IN_LIST defs_${p})
        continue()
      endif()
      set(where)
      foreach(q ${parts})
        if(fn IN_LIST defs_${q})
          list(APPEND where ${q})
        endif()
      endforeach()
      if(where)
        string(REPLACE ";" ", " where "${where}")
        set(where "it is defined in ${where}'s library")
      else()
        set(where "no library defines it")
      endif()
      message(SEND_ERROR "include/${h}:${line}: ${fn} is declared in a door of ${p} (cmake/layers.cmake, "
                         "MS_OWNS_${p}) and not defined in ${p}'s library (${lib_${p}}); ${where}")
      set(bad 1)
    endforeach()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "doors: public headers declare functions their owners do not define")
endif()
message(STATUS "doors: ${n_checked} functions of the public headers, each defined in its owner's library")

# The include direction of the library's parts, checked on every quoted include of every library
# file: a part includes the public headers, its own headers and those of the parts below it, each
# named with its folder. Run as `cmake -DSOURCE_DIR=<repository> -P layering_check.cmake`.
#
# The parts, bottom-up (docs/architecture.md, "Parts and layers", says what each holds).
set(zeroshard_parts
  util layout precision memory config kernels optim backend comm offload checkpoint monitor
  engine estimator torch tools)

if(NOT SOURCE_DIR)
  message(FATAL_ERROR "layering_check.cmake: pass -DSOURCE_DIR=<the repository's root>")
endif()

# The part of a library file, from its path relative to the repository's root.
function(part_of_file path out)
  if(path MATCHES "^include/zeroshard/")
    set(${out} public PARENT_SCOPE)
  elseif(path MATCHES "^src/([a-z_]+)/")
    set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
  elseif(path MATCHES "^(offload|kernels)/")
    set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# The part an include names by its first folder, or "" when it names none.
function(part_of_include include out)
  set(part "")
  if(include MATCHES "^zeroshard/")
    set(part public)
  elseif(include MATCHES "^([a-z_]+)/")
    list(FIND zeroshard_parts ${CMAKE_MATCH_1} index)
    if(index GREATER_EQUAL 0)
      set(part ${CMAKE_MATCH_1})
    endif()
  endif()
  set(${out} "${part}" PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE files RELATIVE ${SOURCE_DIR}
  ${SOURCE_DIR}/include/*.h ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cpp
  ${SOURCE_DIR}/src/*.inc ${SOURCE_DIR}/offload/*.h ${SOURCE_DIR}/offload/*.cpp
  ${SOURCE_DIR}/kernels/*.h ${SOURCE_DIR}/kernels/*.cpp ${SOURCE_DIR}/kernels/*.inc
  ${SOURCE_DIR}/kernels/*.cu ${SOURCE_DIR}/kernels/*.cuh)

set(violations "")
set(checked 0)
foreach(file IN LISTS files)
  part_of_file(${file} from)
  if(from STREQUAL "")
    continue()
  endif()
  if(NOT from STREQUAL "public")
    list(FIND zeroshard_parts ${from} from_index)
    if(from_index LESS 0)
      string(APPEND violations "\n  ${file}: folder src/${from} is no part of the list")
      continue()
    endif()
  endif()
  file(STRINGS ${SOURCE_DIR}/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*$" "\\1" include "${line}")
    math(EXPR checked "${checked} + 1")
    part_of_include("${include}" to)
    if(to STREQUAL "")
      string(APPEND violations
             "\n  ${file}: \"${include}\" names no part's folder (write the folder: util/..., "
             "offload/..., kernels/cpu/..., zeroshard/...)")
      continue()
    endif()
    if(NOT EXISTS ${SOURCE_DIR}/include/${include} AND NOT EXISTS ${SOURCE_DIR}/src/${include}
       AND NOT EXISTS ${SOURCE_DIR}/${include})
      string(APPEND violations "\n  ${file}: \"${include}\" is no file of the library")
      continue()
    endif()
    if(from STREQUAL "public")
      if(NOT to STREQUAL "public")
        string(APPEND violations
               "\n  ${file}: a public header includes \"${include}\", an internal one")
      endif()
      continue()
    endif()
    if(to STREQUAL "public")
      continue()
    endif()
    list(FIND zeroshard_parts ${to} to_index)
    if(to_index GREATER from_index)
      string(APPEND violations
             "\n  ${file}: part '${from}' includes \"${include}\" of '${to}', a part above it")
    endif()
  endforeach()
endforeach()

if(checked EQUAL 0)
  message(FATAL_ERROR "layering_check.cmake: found no include under ${SOURCE_DIR}")
endif()
if(violations)
  message(FATAL_ERROR "the library's parts include against their order "
                      "(${zeroshard_parts}):${violations}")
endif()
message(STATUS "layering: ${checked} includes follow the parts' order")

# Fails unless every symbol libzeroshard.so exports belongs to the public API. The rule: each
# defined dynamic symbol is a function or object of namespace zeroshard, or the typeinfo,
# typeinfo name or vtable of a class in it, and names nothing of zeroshard::detail,
# zeroshard::kernels or an anonymous namespace (not even in a parameter type).
# Run with -DNM=... -DLIBRARY=...
execute_process(COMMAND ${NM} -DC --defined-only ${LIBRARY} RESULT_VARIABLE rc
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors)
if(rc)
  message(FATAL_ERROR "${NM} -DC --defined-only ${LIBRARY} failed (${rc}): ${errors}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(count 0)
set(bad)
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^[0-9a-fA-F]+ ([A-Za-z]) (.*)$")
    continue()
  endif()
  set(type ${CMAKE_MATCH_1})
  set(name "${CMAKE_MATCH_2}")
  math(EXPR count "${count} + 1")
  string(REGEX REPLACE "^(typeinfo name for |typeinfo for |vtable for |VTT for )" "" entity
         "${name}")
  if(name MATCHES "zeroshard::(detail|kernels)::|anonymous namespace")
    list(APPEND bad "${type} ${name}")
  elseif(entity MATCHES "^zeroshard::")
    # The public API.
  else()
    list(APPEND bad "${type} ${name}")
  endif()
endforeach()
list(LENGTH bad bad_count)
message(STATUS "${LIBRARY}: ${count} exported symbols, ${bad_count} outside the public API")
if(bad_count GREATER 0)
  list(JOIN bad "\n  " bad_text)
  message(FATAL_ERROR "exported symbols outside the public API:\n  ${bad_text}")
endif()
if(count EQUAL 0)
  message(FATAL_ERROR "${LIBRARY} exports nothing: the listing was not read")
endif()

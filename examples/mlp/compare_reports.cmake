# cmake -DLEFT=a.json -DLEFT_KEYS="k1;k2" -DRIGHT=b.json -DRIGHT_KEYS="k1;k2" -P compare_reports.cmake
# Fails unless each LEFT key's value is textually equal to the matching RIGHT key's: the reports
# write doubles so that they read back exactly, so equal text is bit-equal values.
file(READ ${LEFT} left_json)
file(READ ${RIGHT} right_json)
list(LENGTH LEFT_KEYS count)
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  list(GET LEFT_KEYS ${i} left_key)
  list(GET RIGHT_KEYS ${i} right_key)
  string(JSON left_value GET "${left_json}" ${left_key})
  string(JSON right_value GET "${right_json}" ${right_key})
  if(NOT left_value STREQUAL right_value)
    message(FATAL_ERROR "${LEFT} ${left_key} = ${left_value}\n${RIGHT} ${right_key} = ${right_value}")
  endif()
  message(STATUS "${left_key} = ${right_key} = ${left_value}")
endforeach()

#ifndef ASYNCPS_TESTS_TESTING_REQUIRE_OK_H_
#define ASYNCPS_TESTS_TESTING_REQUIRE_OK_H_

#include <catch2/catch.hpp>

#include "absl/status/status.h"

// REQUIRE that an absl::Status expression is OK, showing the status when it
// is not.
#define REQUIRE_OK(expr)                 \
  do {                                   \
    const absl::Status _status = (expr); \
    INFO(_status.ToString());            \
    REQUIRE(_status.ok());               \
  } while (0)

#endif  // ASYNCPS_TESTS_TESTING_REQUIRE_OK_H_

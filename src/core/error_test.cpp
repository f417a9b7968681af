// error_test.cpp — a user's mistake (Error) and a bug of attnres (InternalError) stay apart.
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace attnres {
namespace {

TEST(Errors, ACheckIsAnInternalErrorWithFileAndLine) {
  try {
    const int n = 3;
    ATTNRES_CHECK(n == 4, "n is ", n);
    FAIL() << "no throw";
  } catch (const Error&) {
    FAIL() << "a broken invariant must not be an Error (a handler would take it for bad input)";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("error_test.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("check `n == 4` failed: n is 3"), std::string::npos) << what;
  }
  EXPECT_THROW(fail("bad flag"), Error);
}

}  // namespace
}  // namespace attnres

// Test support: the message of an expected exception, for checks on its text.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace ldlm::test {

/// The message of the exception E thrown by f; a test failure (and "") when f throws
/// nothing or another exception type.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "nothing thrown";
  return "";
}

}  // namespace ldlm::test

// What every fuzz target asserts: an input either parses into a valid object or is refused with a
// clean exception (std::invalid_argument or std::runtime_error whose message starts with
// "[function]"); anything else, or a broken contract, aborts with a message (a libFuzzer crash).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

namespace edbatch::fuzz {

[[noreturn]] inline void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz contract broken: %s\n", what.c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, what)                                                \
  do {                                                                        \
    if (!(cond)) ::edbatch::fuzz::broken(std::string(#cond) + ": " + (what)); \
  } while (0)

// A refusal must be clean: the two exception types of the library, a "[function]" prefix.
inline void check_refusal(const std::exception& e) {
  const std::string m = e.what();
  if (m.empty() || m[0] != '[') broken("error message without a [function] prefix: " + m);
  if (dynamic_cast<const std::invalid_argument*>(&e) == nullptr &&
      dynamic_cast<const std::runtime_error*>(&e) == nullptr)
    broken("error of another type than invalid_argument or runtime_error: " + m);
}

// Runs `parse`; returns false (after checking the refusal) when it throws.
template <class F>
bool parses(const F& parse) {
  try {
    parse();
    return true;
  } catch (const std::invalid_argument& e) {
    check_refusal(e);
  } catch (const std::runtime_error& e) {
    check_refusal(e);
  } catch (const std::exception& e) {
    broken(std::string("unexpected exception type: ") + e.what());
  }
  return false;
}

}  // namespace edbatch::fuzz

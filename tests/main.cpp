// The main() of every test binary: doctest's, with two exit codes of its own.
//
// - 77 when every test case passed and one of them called skip() (util.h): no usable GPU, a data
//   set that is not installed. ctest reports a test registered with SKIP_RETURN_CODE 77 as
//   Skipped (tests/CMakeLists.txt). A binary with a failure exits with doctest's code, 1, and
//   ctest reports it as Failed, whatever was skipped.
// - 1 when no test case matched the filters (-tc=..., -tce=...): a ctest entry that selects cases
//   by name must not pass by running nothing after a case was renamed.
//
// When generated C++ kernels were queued (DUET_CODEGEN=1), it prints how many were built and
// swapped in, so that a log shows how much of the run used them.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "trace/plan/codegen.h"
#include "util.h"

namespace {

int g_cases_run = -1;  // test cases that passed the filters; -1: the run did not end

// A listener that records how many test cases passed the filters.
struct CaseCounter : doctest::IReporter {
  explicit CaseCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override {
    g_cases_run = static_cast<int>(s.numTestCasesPassingFilters);
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("duet_case_counter", 1, CaseCounter);

}  // namespace

int main(int argc, char** argv) {
  // duet::print's lines (the op-table sweeps print) are dropped; test_print captures its own.
  duet::detail::set_print_sink([](const std::string&) {});
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;  // --help, --list-test-cases and other queries
  const duet::codegen::CodegenStats cg = duet::codegen::stats();
  if (cg.queued > 0)
    std::printf(
        "generated kernels: %lld queued, %lld built, %lld from the disk cache, %lld swapped in, "
        "%lld failed\n",
        static_cast<long long>(cg.queued), static_cast<long long>(cg.built),
        static_cast<long long>(cg.cache_hits), static_cast<long long>(cg.loaded),
        static_cast<long long>(cg.failed));
  if (rc != 0) return rc;
  if (g_cases_run == 0) {
    std::fprintf(stderr, "no test case matched the filters: nothing was tested\n");
    return 1;
  }
  return duet::test::skipped() ? 77 : 0;
}

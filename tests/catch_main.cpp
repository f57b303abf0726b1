// The tests' main, for Catch2 v3 and Debian's v2 alike (the same header
// choice as catch.hpp: the main must run the session the tests registered in).
//
// Built with SPINDLE_TEST_BACKEND_CHECK (the programs that link spindle), it
// first opens one loop on the backend SPINDLE_BACKEND names. A backend that
// cannot start here (io_uring forbidden by a container's seccomp profile, a
// backend not built in) makes the program exit 77, which meson reports as
// skipped: neither a pass that tested nothing nor a failure of every case.
// A value that names no backend is a mistake, and fails.

#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#if SPINDLE_TEST_BACKEND_CHECK
#include <spindle/loop.hpp>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <system_error>
#endif

int main(int argc, char** argv) {
#if SPINDLE_TEST_BACKEND_CHECK
    constexpr int exit_skipped = 77;  // what meson reads as a skipped test
    if (const char* name = std::getenv("SPINDLE_BACKEND"); name && *name) {
        try {
            spindle::loop probe;
        } catch (const std::system_error& e) {
            std::fprintf(stderr, "skipped: backend %s cannot start: %s\n", name, e.what());
            return exit_skipped;
        } catch (const std::invalid_argument& e) {
            std::fprintf(stderr, "error: %s\n", e.what());
            return 1;
        }
    }
#endif
    return Catch::Session().run(argc, argv);
}

#include "support.hpp"

TEST_CASE("placeholder signals", "[signals]") { SUCCEED(); }

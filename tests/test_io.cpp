#include "support.hpp"

TEST_CASE("placeholder io", "[io]") { SUCCEED(); }

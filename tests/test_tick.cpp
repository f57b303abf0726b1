#include "support.hpp"

TEST_CASE("placeholder tick", "[tick]") { SUCCEED(); }

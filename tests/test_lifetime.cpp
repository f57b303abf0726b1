#include "support.hpp"

TEST_CASE("placeholder lifetime", "[lifetime]") { SUCCEED(); }

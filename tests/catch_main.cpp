// Catch2 v2 needs one translation unit with its main; v3 ships catch2-with-main.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#pragma once
// The tests compile against Catch2 v3 and Debian's Catch2 v2.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

// The one Catch2 main every test executable links (compiled once).
//
// GCC 12 with optimization and the sanitizers warns inside libstdc++'s <regex>, which
// Catch2's main instantiates (-Wmaybe-uninitialized on std::function moves: a known
// false positive); nothing of quota's is compiled here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

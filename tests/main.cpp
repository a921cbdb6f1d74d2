// The one doctest main shared by the test executables: it is slow to compile, so it stays in
// its own translation unit.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

// The translation unit that compiles test_pch.hpp into the tests' precompiled header.

// The translation unit that builds the tests' precompiled header (duet_test_pch in
// tests/CMakeLists.txt). It has no code of its own.

#pragma once

// The overlay's host-only unit tests (cell overlay-unit): count checks, print each failure.

#include <cstdio>
#include <string>

struct unit_check {
    int checks   = 0;
    int failures = 0;

    void expect(bool ok, const std::string & what) {
        ++checks;
        if (!ok) {
            ++failures;
            std::printf("FAILED: %s\n", what.c_str());
        }
    }

    // Prints the tally; the process's exit status.
    int finish(const char * name) const {
        std::printf("%s: %d checks, %d failed\n", name, checks, failures);
        return failures == 0 ? 0 : 1;
    }
};

#pragma once

// The vendor kernels' switches. Each caller reads its variable once into a function-local static:
// the launches are on the decode path, and a switch never changes within a process.

#include <cstdlib>

// `by_default` when `name` is unset, else whether its value is a non-zero integer.
static inline bool frt_env_flag(const char * name, bool by_default) {
    const char * env = std::getenv(name);
    return env == nullptr ? by_default : std::atoi(env) != 0;
}

// The integer value of `name`, or `fallback` when it is unset.
static inline int frt_env_int(const char * name, int fallback) {
    const char * env = std::getenv(name);
    return env == nullptr ? fallback : std::atoi(env);
}

#include "switches.h"

#include <cstring>

const char * flashrt_tier_name(flashrt_tier tier) {
    switch (tier) {
        case flashrt_tier::safe:    return "safe";
        case flashrt_tier::full:    return "full";
        case flashrt_tier::archive: return "archive";
    }
    return "?";
}

// 1 or 0 for "1"/"0", -1 when unset, -2 (with a warning) for anything else.
static int read_bool(const std::string & key, flashrt_env_lookup env, void * user, std::vector<std::string> & warnings) {
    const char * value = env(key.c_str(), user);
    if (value == nullptr) {
        return -1;
    }
    if (std::strcmp(value, "1") == 0) {
        return 1;
    }
    if (std::strcmp(value, "0") == 0) {
        return 0;
    }
    warnings.push_back(key + "=" + value + " ignored: use 0 or 1");
    return -2;
}

bool flashrt_layer_disabled(flashrt_env_lookup env, void * user, std::vector<std::string> & warnings) {
    return read_bool("GGML_CUDA_FLASHRT_DISABLE", env, user, warnings) == 1;
}

flashrt_switch flashrt_window_switch(const char * name, flashrt_tier tier, flashrt_env_lookup env, void * user,
                                     std::vector<std::string> & warnings) {
    if (flashrt_layer_disabled(env, user, warnings)) {
        return { false, "GGML_CUDA_FLASHRT_DISABLE=1" };
    }
    const std::string no_key = std::string("GGML_FLASHRT_NO_") + name;
    if (read_bool(no_key, env, user, warnings) == 1) {
        return { false, no_key + "=1" };
    }
    const std::string swap_key = std::string("FRT_") + name + "_SWAP";
    const int swap = read_bool(swap_key, env, user, warnings);
    if (swap == 0 || swap == 1) {
        return { swap == 1, swap_key + "=" + std::to_string(swap) };
    }
    return { tier == flashrt_tier::safe, std::string("tier ") + flashrt_tier_name(tier) };
}

std::vector<std::string> flashrt_unknown_switches(const std::vector<std::string> & environment,
                                                  const std::vector<std::string> & window_names) {
    auto known = [&](const std::string & name) {
        for (const std::string & w : window_names) {
            if (w == name) {
                return true;
            }
        }
        return false;
    };
    std::vector<std::string> unknown;
    const std::string no_prefix = "GGML_FLASHRT_NO_";
    const std::string swap_prefix = "FRT_";
    const std::string swap_suffix = "_SWAP";
    for (const std::string & entry : environment) {
        const std::string key = entry.substr(0, entry.find('='));
        std::string name;
        if (key.compare(0, no_prefix.size(), no_prefix) == 0) {
            name = key.substr(no_prefix.size());
        } else if (key.size() > swap_prefix.size() + swap_suffix.size() &&
                   key.compare(0, swap_prefix.size(), swap_prefix) == 0 &&
                   key.compare(key.size() - swap_suffix.size(), swap_suffix.size(), swap_suffix) == 0) {
            name = key.substr(swap_prefix.size(), key.size() - swap_prefix.size() - swap_suffix.size());
        } else {
            continue;
        }
        if (!known(name)) {
            unknown.push_back(key);
        }
    }
    return unknown;
}

// Unit test of the switch precedence (switches.h). Built and run by `cargo xtask ci` (cell
// overlay-unit) with the host C++ compiler; needs no GPU and no ggml.

#include "../switches.h"
#include "unit-check.h"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

using env_table = std::map<std::string, std::string>;

static const char * lookup(const char * name, void * user) {
    const env_table & env = *static_cast<env_table *>(user);
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
}

static unit_check check;

static void expect(bool ok, const std::string & what) {
    check.expect(ok, what);
}

struct row {
    env_table    env;
    flashrt_tier tier;
    bool         enabled;
    const char * reason;
    size_t       warnings;
};

int main() {
    const flashrt_tier safe = flashrt_tier::safe, full = flashrt_tier::full, archive = flashrt_tier::archive;
    const std::vector<row> table = {
        // tier defaults
        { {}, safe, true, "tier safe", 0 },
        { {}, full, false, "tier full", 0 },
        { {}, archive, false, "tier archive", 0 },
        // the whole layer off beats everything
        { { { "GGML_CUDA_FLASHRT_DISABLE", "1" } }, safe, false, "GGML_CUDA_FLASHRT_DISABLE=1", 0 },
        { { { "GGML_CUDA_FLASHRT_DISABLE", "1" }, { "FRT_W_SWAP", "1" } }, full, false, "GGML_CUDA_FLASHRT_DISABLE=1", 0 },
        { { { "GGML_CUDA_FLASHRT_DISABLE", "0" } }, safe, true, "tier safe", 0 },
        // one window off
        { { { "GGML_FLASHRT_NO_W", "1" } }, safe, false, "GGML_FLASHRT_NO_W=1", 0 },
        { { { "GGML_FLASHRT_NO_W", "1" }, { "FRT_W_SWAP", "1" } }, safe, false, "GGML_FLASHRT_NO_W=1", 0 },
        { { { "GGML_FLASHRT_NO_W", "0" } }, safe, true, "tier safe", 0 },
        // forced, whatever the tier
        { { { "FRT_W_SWAP", "1" } }, full, true, "FRT_W_SWAP=1", 0 },
        { { { "FRT_W_SWAP", "1" } }, archive, true, "FRT_W_SWAP=1", 0 },
        { { { "FRT_W_SWAP", "0" } }, safe, false, "FRT_W_SWAP=0", 0 },
        { { { "GGML_FLASHRT_NO_W", "0" }, { "FRT_W_SWAP", "1" } }, full, true, "FRT_W_SWAP=1", 0 },
        // other windows' switches do not apply
        { { { "GGML_FLASHRT_NO_OTHER", "1" }, { "FRT_OTHER_SWAP", "0" } }, safe, true, "tier safe", 0 },
        // bad values: reported, ignored
        { { { "FRT_W_SWAP", "yes" } }, full, false, "tier full", 1 },
        { { { "GGML_FLASHRT_NO_W", "true" } }, safe, true, "tier safe", 1 },
        { { { "GGML_CUDA_FLASHRT_DISABLE", "on" }, { "FRT_W_SWAP", "2" } }, safe, true, "tier safe", 2 },
    };
    int i = 0;
    for (row r : table) {
        std::vector<std::string> warnings;
        const flashrt_switch s = flashrt_window_switch("W", r.tier, lookup, &r.env, warnings);
        const std::string where = "row " + std::to_string(i++);
        expect(s.enabled == r.enabled, where + ": enabled");
        expect(s.reason == r.reason, where + ": reason '" + s.reason + "' expected '" + r.reason + "'");
        expect(warnings.size() == r.warnings, where + ": " + std::to_string(warnings.size()) + " warnings");
    }

    const std::vector<std::string> unknown = flashrt_unknown_switches(
        { "PATH=/bin", "GGML_FLASHRT_NO_W=1", "GGML_FLASHRT_NO_TYPO=1", "FRT_W_SWAP=0", "FRT_NOPE_SWAP=1", "FRT_STATS=1",
          "GGML_FLASHRT_DEBUG=1" },
        { "W" });
    expect(unknown.size() == 2 && unknown[0] == "GGML_FLASHRT_NO_TYPO" && unknown[1] == "FRT_NOPE_SWAP",
           "unknown switches are the two typos");

    return check.finish("test-switches");
}

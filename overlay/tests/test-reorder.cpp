// Unit test of the node order for the decode GEMV packs (reorder.h). Built and run by
// `cargo xtask ci` (cell overlay-unit) with the host C++ compiler; needs no GPU and no ggml.

#include "../reorder.h"
#include "unit-check.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

static unit_check check;

static void expect(bool ok, const std::string & what) {
    check.expect(ok, what);
}

static std::string str(const std::vector<int> & v) {
    std::string s;
    for (int x : v) {
        s += (s.empty() ? "" : " ") + std::to_string(x);
    }
    return s;
}

// A permutation of 0..n-1 in which every node comes after its sources.
static bool valid(const std::vector<std::vector<int>> & srcs, const std::vector<int> & order) {
    const int        n = (int) srcs.size();
    std::vector<int> at(n, -1);
    if ((int) order.size() != n) {
        return false;
    }
    for (int k = 0; k < n; ++k) {
        if (order[k] < 0 || order[k] >= n || at[order[k]] >= 0) {
            return false;
        }
        at[order[k]] = k;
    }
    for (int i = 0; i < n; ++i) {
        for (int s : srcs[i]) {
            if (at[s] > at[i]) {
                return false;
            }
        }
    }
    return true;
}

int main() {
    // A Gated DeltaNet layer's shape: 0 norm, 1 mul (the normed value), 2 qkv matvec, 3..5 the
    // conv path reading 2, 6 the z matvec (reads 1), 7 beta matvec (reads 1), 8 reads 3..7.
    {
        const std::vector<std::vector<int>> srcs = { {}, { 0 }, { 1 }, { 2 }, { 3 }, { 4 }, { 1 }, { 1 }, { 5, 6, 7 } };
        const std::vector<int> order = flashrt_pull_forward(srcs, { { 1, { 2, 6, 7 } } });
        expect(order == std::vector<int>({ 0, 1, 2, 6, 7, 3, 4, 5, 8 }), "the pack follows its input: " + str(order));
    }
    // A member whose source comes later stays where it was; the others still move.
    {
        const std::vector<std::vector<int>> srcs = { {}, { 0 }, { 1 }, { 1 }, { 1, 3 }, { 4 } };
        const std::vector<int> order = flashrt_pull_forward(srcs, { { 1, { 4, 5, 2 } } });
        expect(valid(srcs, order), "valid: " + str(order));
        expect(order == std::vector<int>({ 0, 1, 2, 3, 4, 5 }), "4 needs 3, 5 needs 4: " + str(order));
        const std::vector<int> order2 = flashrt_pull_forward(srcs, { { 1, { 3, 4, 5 } } });
        expect(order2 == std::vector<int>({ 0, 1, 3, 4, 5, 2 }), "members in their order: " + str(order2));
    }
    // Chained groups: a member that is another group's `after` brings that group along.
    {
        const std::vector<std::vector<int>> srcs = { {}, {}, { 0 }, {}, { 0 }, { 4 }, { 0 } };
        const std::vector<int> order = flashrt_pull_forward(srcs, { { 0, { 4 } }, { 4, { 5 } } });
        expect(valid(srcs, order), "valid: " + str(order));
        expect(order == std::vector<int>({ 0, 4, 5, 1, 2, 3, 6 }), "chain: " + str(order));
    }
    // No groups: the order stays.
    {
        const std::vector<std::vector<int>> srcs = { {}, { 0 }, { 1 } };
        expect(flashrt_pull_forward(srcs, {}) == std::vector<int>({ 0, 1, 2 }), "no groups");
    }
    // Random DAGs and groups: always a valid permutation, and a member is never left behind when
    // all its sources were placed before its group's node.
    std::mt19937 rng(12345);
    for (int t = 0; t < 2000; ++t) {
        const int                     n = 2 + (int) (rng() % 40);
        std::vector<std::vector<int>> srcs(n);
        for (int i = 1; i < n; ++i) {
            for (int k = (int) (rng() % 4); k > 0; --k) {
                srcs[i].push_back((int) (rng() % i));
            }
        }
        std::vector<flashrt_pull_group> groups;
        std::vector<char>               used(n, 0);
        for (int g = (int) (rng() % 4); g > 0; --g) {
            const int after = (int) (rng() % n);
            if (used[after]) {
                continue;
            }
            used[after] = 1;
            flashrt_pull_group group{ after, {} };
            for (int k = (int) (rng() % 5); k > 0; --k) {
                const int m = (int) (rng() % n);
                bool      seen = false;
                for (int x : group.members) {
                    seen = seen || x == m;
                }
                if (!seen) {
                    group.members.push_back(m);
                }
            }
            groups.push_back(group);
        }
        const std::vector<int> order = flashrt_pull_forward(srcs, groups);
        expect(valid(srcs, order), "random case " + std::to_string(t) + ": " + str(order));
        // Sources-only-on-earlier members: a member of the first group whose sources are all at
        // or before `after` (input order) and that no other group takes runs right behind the
        // earlier members of its group.
        if (!groups.empty() && groups.size() == 1) {
            const flashrt_pull_group & g = groups[0];
            std::vector<int>           at(n);
            for (int k = 0; k < n; ++k) {
                at[order[k]] = k;
            }
            int expected_at = at[g.after] + 1;
            for (int m : g.members) {
                bool early = m > g.after;
                for (int s : srcs[m]) {
                    early = early && s <= g.after;
                }
                if (!early || at[m] < at[g.after]) {
                    break;  // the rest's positions depend on this one
                }
                expect(at[m] == expected_at, "random case " + std::to_string(t) + ": member " + std::to_string(m) +
                                                 " follows node " + std::to_string(g.after) + ": " + str(order));
                expected_at = at[m] + 1;
            }
        }
    }
    return check.finish("test-reorder");
}

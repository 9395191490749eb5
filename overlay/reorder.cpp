#include "reorder.h"

#include <functional>

std::vector<int> flashrt_pull_forward(const std::vector<std::vector<int>> & srcs,
                                      const std::vector<flashrt_pull_group> & groups) {
    const int         n = (int) srcs.size();
    std::vector<int>  group_after(n, -1);  // node -> the group that follows it
    std::vector<char> placed(n, 0);
    std::vector<int>  order;
    order.reserve(n);
    for (int g = 0; g < (int) groups.size(); ++g) {
        group_after[groups[g].after] = g;
    }
    const auto ready = [&](int node) {
        for (int s : srcs[node]) {
            if (!placed[s]) {
                return false;
            }
        }
        return true;
    };
    // Places `node` (its sources are placed), then each member of the group that follows it whose
    // sources are placed by its turn, each followed by its own group the same way.
    const std::function<void(int)> place = [&](int node) {
        placed[node] = 1;
        order.push_back(node);
        if (group_after[node] < 0) {
            return;
        }
        for (int m : groups[group_after[node]].members) {
            if (!placed[m] && ready(m)) {
                place(m);
            }
        }
    };
    for (int i = 0; i < n; ++i) {
        if (!placed[i]) {
            // Every node before i in the input order is placed, so are i's sources.
            place(i);
        }
    }
    return order;
}

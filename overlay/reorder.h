#pragma once

// Node order for the decode GEMV packs, as plain indices (no ggml: unit-tested on the host).
//
// ggml-alloc hands out memory in node order and lends a tensor's memory to others until the node
// that computes it. A window that computes a later matvec early (in one launch with the first)
// can then only do so where that matvec's memory is not lent out meanwhile; elsewhere the pack
// splits into launches of their own. Moving the pack's matvecs right after the value they read,
// before memory is planned (ggml's graph_optimize hook), makes the allocator place them there.

#include <vector>

struct flashrt_pull_group {
    int              after;    // the node the members should follow (the value they read)
    std::vector<int> members;  // later nodes, in the order they should run
};

// A valid order of `n` nodes (order[k]: the node that runs k-th) in which each group's members
// run right after `after`, in their order, where that keeps every node after its sources; a member
// whose sources are not all placed by then stays where it was. srcs[i]: the nodes node i reads
// (in a valid input order every source precedes its reader). A node is the `after` of one group
// at most; a member of several groups goes with the first to reach it.
std::vector<int> flashrt_pull_forward(const std::vector<std::vector<int>> & srcs,
                                      const std::vector<flashrt_pull_group> & groups);

// Where row t of a chunk sits (src/kernels/mod.rs, `Causal::places`): the cache row of its
// sequence's position 0 (`row_lo`) and its position in that sequence (`row_pos`). With
// P.ragged = 1 both come from `places` (two words per row: lo, pos), so one dispatch can
// take rows of several sequences that share a pooled cache (a batched decode step); else
// every row is of one sequence whose position 0 is cache row 0, row t at position
// P.pos0 + t. The including file declares `places` (read-only u32) and P.ragged, P.pos0.

fn row_lo(t: u32) -> u32 {
    if (P.ragged != 0u) {
        return places[2u * t];
    }
    return 0u;
}

fn row_pos(t: u32) -> u32 {
    if (P.ragged != 0u) {
        return places[2u * t + 1u];
    }
    return P.pos0 + t;
}

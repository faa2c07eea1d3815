// ---- Speculative rounds that stay on the GPU (src/kernels/spec.rs) ----------------------
// A greedy speculative round (src/model/draft.rs) whose positions and accepted tokens never
// return to the host before the next round is queued: the round's state lives in `state`
// (u32 words: [0] the next round's first position P, [1] the last verified round's P, [2]
// how many drafts it accepted, then the log slots), and these kernels place a chunk's rows
// from it and accept the drafts (norm.wgsl's rms_norm_sel picks the accepted round's last
// hidden row by word 2).
//
// Bindings are positional (1 ..) and each entry uses a prefix of them: 1 = state, 2 = a
// u32 buffer, 3 = a second one, 4 = a read-only table. Floats are copied as their bits.

// Params (binding 0): declared once, in src/kernels/spec.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;
@group(0) @binding(2) var<storage, read_write> a: array<u32>;
@group(0) @binding(3) var<storage, read_write> b: array<u32>;
@group(0) @binding(4) var<storage, read> table: array<u32>;

const WG: u32 = 64u;

// Rows `0 .. P.rows` of a chunk at positions `state[P.field] + P.offset + r`: their places
// (a: `[lo, pos]` a row) and RoPE's cos/sin rows (b: P.dim words a row, copied from the
// table of every position's rows). Positions past P.last are clamped to it (the host's
// bound keeps them within; the clamp keeps a wrong state from reading past the table).
@compute @workgroup_size(64)
fn round_places(@builtin(global_invocation_id) g: vec3<u32>) {
    let base = min(state[P.field] + P.offset, P.last);
    let e = g.x;
    if (e < P.rows) {
        a[2u * e] = P.lo;
        a[2u * e + 1u] = min(base + e, P.last);
    }
    let n = P.rows * P.dim;
    if (e < n) {
        let r = e / P.dim;
        let pos = min(base + r, P.last);
        b[e] = table[pos * P.dim + e % P.dim];
    }
}

// Acceptance of a greedy round (one invocation). In `a` (the token ids): [0] the round's
// first token, [1 ..= k] its drafts, [P.picks ..= P.picks + k] the main model's argmax after
// each verified row. Accepts the n leading drafts that equal those picks, then:
// - a[P.mtp + j] = the tokens after the verified rows, d_1 .. d_n and the pick after them
//   (the MTP layer's tokens over the accepted rows);
// - a[0] = that pick (the next round's first token);
// - state: [1] = P, [0] = P + n + 1, [2] = n;
// - log slot P.slot (at state[P.log + P.slot * (k + 2)]): n + 1, then the n + 1 tokens.
@compute @workgroup_size(1)
fn accept() {
    let k = P.k;
    var n = 0u;
    loop {
        if (n >= k || a[P.picks + n] != a[1u + n]) {
            break;
        }
        n += 1u;
    }
    let g = a[P.picks + n];
    for (var j = 0u; j < n; j++) {
        a[P.mtp + j] = a[1u + j];
    }
    a[P.mtp + n] = g;
    a[0] = g;
    let p = state[0];
    state[1] = p;
    state[0] = p + n + 1u;
    state[2] = n;
    let s = P.log + P.slot * (k + 2u);
    state[s] = n + 1u;
    for (var j = 0u; j <= n; j++) {
        state[s + 1u + j] = a[P.mtp + j];
    }
}

// ---- Speculative rounds that stay on the GPU (src/kernels/spec.rs) ----------------------
// A greedy speculative round (src/model/draft.rs) whose positions and accepted tokens never
// return to the host before the next round is queued: the round's state lives in `state`
// (u32 words, src/kernels/spec.rs: [0] the next round's first position P, [1] the last
// verified round's P, [2] how many drafts it accepted, [3] a count of finished workgroups,
// then the main model's k + 1 picks of the round at P.pick_at, then the log slots), and these
// kernels place a chunk's rows from it, and pick the main model's tokens and accept the
// drafts (norm.wgsl's rms_norm_sel picks the accepted round's last hidden row by word 2).
// The state is read and written through atomics: argmax_accept's workgroups publish their
// picks there for the last of them.
//
// Bindings are positional (1 ..) and each entry uses a prefix of them: 1 = state, 2 = a
// u32 buffer, 3 = a second one, 4 = a read-only table. Floats are copied as their bits.
// order_key and wins come from sample_key.wgsl, reduce_slice from argmax_reduce.wgsl.

// Params (binding 0): declared once, in src/kernels/spec.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> state: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> a: array<u32>;
@group(0) @binding(3) var<storage, read_write> b: array<u32>;
@group(0) @binding(4) var<storage, read> table: array<u32>;

// argmax_accept's workgroup: 256 invocations, 8 on CPU adapters (define SWG, as sample.wgsl).
const WG: u32 = SWG;
// The count of argmax_accept's finished workgroups.
const TALLY: u32 = 3u;

// argmax_reduce.wgsl reads the logits from b.
fn row_bits(i: u32) -> u32 {
    return b[i];
}

// Rows `0 .. P.rows` of a chunk at positions `state[P.field] + P.offset + r`: their places
// (a: `[lo, pos]` a row) and RoPE's cos/sin rows (b: P.dim words a row, copied from the
// table of every position's rows). Positions past P.last are clamped to it (the host's
// bound keeps them within; the clamp keeps a wrong state from reading past the table).
@compute @workgroup_size(64)
fn round_places(@builtin(global_invocation_id) g: vec3<u32>) {
    let base = min(atomicLoad(&state[P.field]) + P.offset, P.last);
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

// Acceptance of a greedy round (one invocation), the main model's picks after each verified
// row in state[P.pick_at ..= P.pick_at + k]. In `a` (the token ids): [0] the round's first
// token, [1 ..= k] its drafts. Accepts the n leading drafts that equal those picks, then:
// - a[P.mtp + j] = the tokens after the verified rows, d_1 .. d_n and the pick after them
//   (the MTP layer's tokens over the accepted rows);
// - a[0] = that pick (the next round's first token);
// - state: [1] = P, [0] = P + n + 1, [2] = n;
// - log slot P.slot (at state[P.log + P.slot * (k + 2)]): n + 1, then the n + 1 tokens.
fn accept_round() {
    let k = P.k;
    var n = 0u;
    loop {
        if (n >= k || atomicLoad(&state[P.pick_at + n]) != a[1u + n]) {
            break;
        }
        n += 1u;
    }
    let g = atomicLoad(&state[P.pick_at + n]);
    for (var j = 0u; j < n; j++) {
        a[P.mtp + j] = a[1u + j];
    }
    a[P.mtp + n] = g;
    a[0] = g;
    let p = atomicLoad(&state[0]);
    atomicStore(&state[1], p);
    atomicStore(&state[0], p + n + 1u);
    atomicStore(&state[2], n);
    let s = P.log + P.slot * (k + 2u);
    atomicStore(&state[s], n + 1u);
    for (var j = 0u; j <= n; j++) {
        atomicStore(&state[s + 1u + j], a[P.mtp + j]);
    }
}

// accept_round with the picks in a[P.picks ..= P.picks + k] (argmax_rows wrote them: rows
// too long for one workgroup each). One invocation.
@compute @workgroup_size(1)
fn accept() {
    for (var j = 0u; j <= P.k; j++) {
        atomicStore(&state[P.pick_at + j], a[P.picks + j]);
    }
    accept_round();
}

var<workgroup> last: u32;

// The main model's picks and the acceptance in one dispatch: workgroup r (of k + 1) takes
// the argmax of logits row r (b at P.x_off + r · P.x_stride, P.n values; sample.wgsl's
// rule) and publishes it in the state; the last to finish accepts. As router_gemv.wgsl
// counts its workgroups: the pick stored atomically, a storageBarrier() (release), the
// count; the workgroup that completes it passes another storageBarrier() (acquire), runs
// accept_round and sets the count back to zero.
@compute @workgroup_size(SWG)
fn argmax_accept(@builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    reduce_slice(P.x_off + r * P.x_stride, 0u, P.n, lid);
    if (lid == 0u) {
        atomicStore(&state[P.pick_at + r], widx[0]);
    }
    storageBarrier();
    if (lid == 0u) {
        last = select(0u, 1u, atomicAdd(&state[TALLY], 1u) == P.k);
    }
    if (workgroupUniformLoad(&last) == 0u) {
        return;
    }
    storageBarrier();
    if (lid == 0u) {
        accept_round();
        atomicStore(&state[TALLY], 0u);
    }
}

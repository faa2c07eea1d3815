// MoE routing of rows whose router logits a matmul wrote (router_pick.wgsl, prepended, has
// the rule): one workgroup per row, row t's logits at l_off + t · l_stride, its pairs at
// t · stride.

// Params (binding 0): declared once, in src/kernels/router.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> idx: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

@compute @workgroup_size(256)
fn route(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= P.rows) {
        return;
    }
    let lb = P.l_off + t * P.l_stride;
    for (var e = lid; e < N2; e = e + WG) {
        set_expert(e, select(0.0, logits[lb + min(e, P.n_experts - 1u)], e < P.n_experts));
    }
    workgroupBarrier();
    pick_row(lid, t * P.stride);
}

// route_cpu: `route` for CPU adapters (src/kernels/mod.rs, `cpu_kernels`): one invocation
// per row, no workgroup memory and no barrier. The kept groups are a bit mask (each group's
// rank computed from the others' scores); the picks are found one after another, each the
// best entry ranking after the previous pick in `before`'s order, so nothing is sorted or
// stored per expert. Same rule, ties and outputs as `route`.
// Expert e's choice key for the row whose logits start at lb (0 where its group is masked).
fn choice_key(lb: u32, e: u32, keep: vec2<u32>) -> u32 {
    let g = e / (P.n_experts / P.n_group);
    if ((keep[g / 32u] & (1u << (g % 32u))) == 0u) {
        return 0u;
    }
    return key_of(sigmoid(logits[lb + e]) + bias[e]);
}

// Group g's score: the sum of its two largest choice scores (its largest with one expert).
fn group_score(lb: u32, g: u32) -> f32 {
    let gs = P.n_experts / P.n_group;
    var k1 = 0u;
    var k2 = 0u;
    for (var i = 0u; i < gs; i++) {
        let k = choice_key(lb, g * gs + i, vec2<u32>(~0u));
        if (k > k1) {
            k2 = k1;
            k1 = k;
        } else if (k > k2) {
            k2 = k;
        }
    }
    return select(f32_of(k1), f32_of(k1) + f32_of(k2), gs > 1u);
}

@compute @workgroup_size(CPU_WG)
fn route_cpu(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = cpu_item(wid, nwg, lid);
    if (t >= P.rows) {
        return;
    }
    let lb = P.l_off + t * P.l_stride;
    var keep = vec2<u32>(~0u);
    if (P.n_group > 1u && P.topk_group < P.n_group) {
        keep = vec2<u32>(0u);
        for (var g = 0u; g < P.n_group; g++) {
            let mine = group_score(lb, g);
            var rank = 0u;
            for (var o = 0u; o < P.n_group; o++) {
                let so = group_score(lb, o);
                rank += select(0u, 1u, so > mine || (so == mine && o < g));
            }
            if (rank < P.topk_group) {
                keep[g / 32u] |= 1u << (g % 32u);
            }
        }
    }
    let o = t * P.stride;
    // The previous pick (none before the first).
    var pk = 0u;
    var pi = 0u;
    var first = true;
    var total = 0.0;
    for (var j = 0u; j < P.topk; j++) {
        var bk = 0u;
        var bi = P.n_experts;
        for (var e = 0u; e < P.n_experts; e++) {
            let k = choice_key(lb, e, keep);
            let after = first || before(pk, pi, k, e);
            if (after && (bi == P.n_experts || before(k, e, bk, bi))) {
                bk = k;
                bi = e;
            }
        }
        first = false;
        pk = bk;
        pi = bi;
        let s = sigmoid(logits[lb + bi]);
        total += s;
        idx[o + j] = bi;
        weights[o + j] = s;
    }
    // As route: each weight divided by the sum (+1e-20), then scaled.
    for (var j = 0u; j < P.topk; j++) {
        var s = weights[o + j];
        if (P.norm != 0u) {
            s = s / (total + 1e-20);
        }
        weights[o + j] = s * P.scaling;
    }
    if (P.extra == 1u) {
        idx[o + P.topk] = P.extra_id;
        weights[o + P.topk] = 1.0;
    }
}

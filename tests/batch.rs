//! Batched decode steps across sessions (`Session::step_batch`, what `sparsa serve` runs):
//! each sequence's greedy tokens are the ones it gets decoding alone, whatever else is in the
//! batch, when it joined, and where its caches sit in the pool.

use sparsa::gpu::Gpu;
use sparsa::model::{BatchRow, Model, ModelSource, Pick, Session};
use std::sync::Arc;

fn builtin() -> (sparsa::tokenizer::Tokenizer, Model) {
    let src = ModelSource::builtin().expect("built-in model");
    let tok = src.tokenizer().unwrap();
    let gpu =
        Arc::new(Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter"));
    let model = Model::from_source(&src, gpu, &mut |_, _| {}).expect("model loads");
    (tok, model)
}

const CTX: usize = 400;

/// `n` greedy tokens after `prompt` from a session of its own, stepping alone.
fn alone(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = model.session(CTX).unwrap();
    s.forward_pick(prompt, Some((0, &Pick::Argmax))).unwrap();
    let mut out = Vec::new();
    let mut slot = 0;
    for i in 0..n {
        if i + 1 < n {
            s.step_pick(1 - slot, &Pick::Argmax).unwrap();
        }
        out.push(pollster::block_on(s.picked_token(slot)).unwrap());
        slot = 1 - slot;
    }
    out
}

/// A sequence decoding in a pooled session.
struct Running {
    prompt: Vec<u32>,
    join: usize,
    want: usize,
    out: Vec<u32>,
    slot: usize,
    started: bool,
}

#[test]
fn batched_steps_keep_every_sequences_greedy_tokens() {
    let (tok, model) = builtin();
    let texts = [
        "Once upon a time",
        "The old lighthouse keeper climbed the stairs every evening. He lit the lamp, wound the clock, and watched the ships pass in the dark. One night a storm came from the north, and the sea rose higher than anyone in the village could remember. The keeper",
        "She opened the letter and read it twice. Then she",
        "In the morning the fishermen",
        "The garden behind the house was full of roses, tulips and tall sunflowers that the children had planted in the spring. Every afternoon they",
    ];
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t).unwrap()).collect();
    // Prompts past the indexer's top-k (64 positions) and below it, in one batch.
    assert!(prompts.iter().any(|p| p.len() > 64) && prompts.iter().any(|p| p.len() < 64));
    let want = [24usize, 18, 30, 12, 20];
    let joins = [0usize, 0, 3, 5, 9];
    let cache = model.default_cache(CTX);
    let mut sessions = model
        .pooled_sessions(CTX, cache, prompts.len())
        .unwrap()
        .expect("the built-in model's pool fits one binding");
    // Sessions used in an order other than the pool's: the batch's first row (whose
    // scratch runs the step) is not always region 0.
    sessions.rotate_left(2);
    let mut run: Vec<Running> = prompts
        .iter()
        .zip(want.iter().zip(joins))
        .map(|(p, (&want, join))| Running {
            prompt: p.clone(),
            join,
            want,
            out: Vec::new(),
            slot: 0,
            started: false,
        })
        .collect();
    let mut widest = 0;
    for turn in 0.. {
        if run.iter().all(|r| r.out.len() == r.want) {
            break;
        }
        assert!(turn < 200, "the batch does not finish");
        for (r, s) in run.iter_mut().zip(sessions.iter_mut()) {
            if r.join == turn {
                s.forward_pick(&r.prompt, Some((0, &Pick::Argmax))).unwrap();
                r.started = true;
            }
        }
        // Every started sequence that needs a token after the one waiting steps ahead, in
        // one batch.
        let mut rows: Vec<BatchRow> = run
            .iter()
            .zip(sessions.iter_mut())
            .filter(|(r, _)| r.started && r.out.len() + 1 < r.want)
            .map(|(r, session)| BatchRow {
                session,
                slot: 1 - r.slot,
                pick: Pick::Argmax,
            })
            .collect();
        widest = widest.max(rows.len());
        Session::step_batch(&mut rows).unwrap();
        drop(rows);
        for (r, s) in run.iter_mut().zip(sessions.iter_mut()) {
            if r.started && r.out.len() < r.want {
                r.out
                    .push(pollster::block_on(s.picked_token(r.slot)).unwrap());
                r.slot = 1 - r.slot;
            }
        }
    }
    assert!(widest >= 4, "the batches held at most {widest} rows");
    for (i, r) in run.iter().enumerate() {
        let solo = alone(&model, &r.prompt, r.want);
        assert_eq!(
            r.out,
            solo,
            "sequence {i} ({} prompt tokens) batched vs alone",
            r.prompt.len()
        );
    }
}

#[test]
fn a_batch_refuses_sessions_of_different_pools() {
    let (tok, model) = builtin();
    let prompt = tok.encode("Once upon a time").unwrap();
    let mut a = model.session(CTX).unwrap();
    let mut b = model.session(CTX).unwrap();
    for s in [&mut a, &mut b] {
        s.forward_pick(&prompt, Some((0, &Pick::Argmax))).unwrap();
    }
    let mut rows = [
        BatchRow {
            session: &mut a,
            slot: 1,
            pick: Pick::Argmax,
        },
        BatchRow {
            session: &mut b,
            slot: 1,
            pick: Pick::Argmax,
        },
    ];
    let err = Session::step_batch(&mut rows).unwrap_err().to_string();
    assert!(err.contains("cache pool"), "{err}");
}

/// `Session::warm_batch` (what `sparsa serve` runs at startup for every width it batches):
/// afterwards a batched step of any of those widths compiles no pipeline, past the indexer's
/// top-k too, and the sessions are as they were: a sequence stopped between two steps (its
/// next input picked on the GPU) goes on with the tokens it gets alone.
#[test]
fn a_warm_up_compiles_every_width_and_changes_nothing() {
    let (tok, model) = builtin();
    let texts = [
        "Once upon a time",
        "She opened the letter and read it twice. Then she",
        "The old lighthouse keeper climbed the stairs every evening. He lit the lamp, wound the clock, and watched the ships pass in the dark. One night a storm came from the north, and the sea rose higher than anyone in the village could remember. The keeper",
    ];
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t).unwrap()).collect();
    assert!(prompts[2].len() > 64, "a prompt past the indexer's top-k");
    // Widths 3, 2, then 1 as the sequences finish, the long prompt's row in each (past the
    // indexer's top-k: its scores and top-k run; before it, only a selection of every
    // position, which prefill compiles too).
    let want = [4usize, 8, 12];
    let cache = model.default_cache(CTX);
    let mut ss = model
        .pooled_sessions(CTX, cache, prompts.len())
        .unwrap()
        .expect("the built-in model's pool fits one binding");
    // Session 1 has a conversation: its first token read, the next input left on the GPU.
    ss[1]
        .forward_pick(&prompts[1], Some((0, &Pick::Argmax)))
        .unwrap();
    let mut outs = vec![Vec::new(); 3];
    outs[1].push(pollster::block_on(ss[1].picked_token(0)).unwrap());
    let pos = ss[1].pos;
    for width in 1..=ss.len() {
        Session::warm_batch(&mut ss[..width]).unwrap();
    }
    assert_eq!(ss[1].pos, pos, "the warm-up rolls the positions back");
    for i in [0, 2] {
        ss[i]
            .forward_pick(&prompts[i], Some((0, &Pick::Argmax)))
            .unwrap();
        outs[i].push(pollster::block_on(ss[i].picked_token(0)).unwrap());
    }
    let compiled = variants(&model);
    let mut widths = Vec::new();
    loop {
        let mut rows: Vec<BatchRow> = ss
            .iter_mut()
            .zip(&outs)
            .zip(want)
            .filter(|((_, out), want)| out.len() < *want)
            .map(|((session, _), _)| BatchRow {
                session,
                slot: 0,
                pick: Pick::Argmax,
            })
            .collect();
        if rows.is_empty() {
            break;
        }
        widths.push(rows.len());
        Session::step_batch(&mut rows).unwrap();
        drop(rows);
        for ((s, out), want) in ss.iter_mut().zip(&mut outs).zip(want) {
            if out.len() < want {
                out.push(pollster::block_on(s.picked_token(0)).unwrap());
            }
        }
    }
    assert!(
        [1, 2, 3].iter().all(|w| widths.contains(w)),
        "batch widths {widths:?}"
    );
    let new: Vec<String> = variants(&model)
        .into_iter()
        .filter(|v| !compiled.contains(v))
        .collect();
    assert!(
        new.is_empty(),
        "batched steps compiled pipelines after the warm-up: {new:#?}"
    );
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(
            *out,
            alone(&model, &prompts[i], want[i]),
            "sequence {i} after the warm-up vs alone"
        );
    }
}

/// The pipelines compiled so far, as `shader::entry defines`.
fn variants(model: &Model) -> Vec<String> {
    model
        .gpu
        .shader_variants()
        .iter()
        .map(|v| {
            format!(
                "{}::{} {}",
                v.shader.name,
                v.entry,
                v.defines.replace('\n', " ")
            )
        })
        .collect()
}

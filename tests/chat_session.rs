//! [`Chat`] against a real session of the built-in model: the second turn prefills only what
//! the caches do not hold, and still produces exactly what a fresh prefill of the whole
//! rendered conversation produces; an interrupted prefill leaves the caches consistent; and
//! decoding (speculative rounds included) creates no GPU buffer or bind group after a
//! warm-up, and prefills leave none behind.

use sparsa::chat::{Chat, ChatEvent, ChatFormat, ChatTemplate, Prepared, ReplyEnd, ReplyOptions};
use sparsa::generate::{generate, generate_events, Sampler, SamplingParams};
use sparsa::gpu::{Gpu, GpuStats};
use sparsa::model::{Model, ModelSource};
use sparsa::tokenizer::Tokenizer;
use std::sync::Arc;

/// The built-in model on the test adapter (`SPARSA_ADAPTER` picks one), its tokenizer and
/// chat template.
fn builtin_chat_model() -> (Tokenizer, Option<ChatTemplate>, Model) {
    let src = ModelSource::builtin().expect("built-in model");
    let tok = src.tokenizer().unwrap();
    let template =
        ChatTemplate::from_config_texts(src.tokenizer_config.as_deref().unwrap(), None).unwrap();
    let gpu =
        Arc::new(Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter"));
    let model = Model::from_source(&src, gpu, &mut |_, _| {}).expect("model loads");
    (tok, template, model)
}

#[test]
fn second_turn_reuses_the_cache_and_matches_a_fresh_prefill() {
    let (tok, template, model) = builtin_chat_model();
    let ctx = 256;
    let mut session = model.session(ctx).unwrap();
    let mut chat = Chat::new(ChatFormat::new(template), None);
    let params = SamplingParams {
        temperature: 0.0,
        repeat_penalty: 1.3,
        ..Default::default()
    };
    let mut sampler = Sampler::new(params.clone());
    let opts = ReplyOptions {
        max_tokens: 5,
        eos: model.config.eos_token_ids.clone(),
        stop: vec![],
    };
    let plan = |chat: &mut Chat, text: &str| match chat.prepare(&tok, text, ctx, 5).unwrap() {
        Prepared::Ready(p) => p,
        Prepared::TooLong { .. } => panic!("fits"),
    };

    let p1 = plan(&mut chat, "Good morrow, sir.");
    let r1 = chat
        .reply(&mut session, &tok, p1, &mut sampler, &opts, |_| true)
        .unwrap();
    assert_eq!((r1.reused, r1.prefilled), (0, r1.prompt_tokens));
    assert_eq!(chat.cached().len(), session.pos);
    let after1 = chat.cached().to_vec();

    let p2 = plan(&mut chat, "What news from the court?");
    assert_eq!(
        p2.reused,
        after1.len(),
        "turn 1's prompt and reply are reused"
    );
    let full = p2.prompt.clone();
    let mut got = Vec::new();
    let r2 = chat
        .reply(&mut session, &tok, p2, &mut sampler, &opts, |e| {
            if let ChatEvent::Token(id) = e {
                got.push(id);
            }
            true
        })
        .unwrap();
    assert_eq!(r2.reused, after1.len());
    assert_eq!(r2.prefilled, full.len() - after1.len());
    assert_eq!(chat.conversation.messages.len(), 4);

    // The same conversation prefilled from scratch picks the same tokens (the repetition
    // penalty included, which looks back into the reused part).
    let mut fresh = model.session(ctx).unwrap();
    let (want, _) = generate_events(
        &mut fresh,
        &[],
        &full,
        opts.max_tokens,
        &mut Sampler::new(params),
        &opts.eos,
        |_| true,
    )
    .unwrap();
    assert_eq!(got, want);
    assert_eq!(
        chat.cached(),
        &[&full[..], &got[..got.len() - 1]].concat()[..]
    );

    // Interrupted during the prefill: nothing is said, the message is taken back, and the
    // recorded cache contents still match the session.
    let p3 = plan(&mut chat, "Then farewell, good sir, and fare you well.");
    let r3 = chat
        .reply(&mut session, &tok, p3, &mut sampler, &opts, |e| {
            !matches!(e, ChatEvent::Prefill { .. })
        })
        .unwrap();
    assert_eq!(r3.end, ReplyEnd::Interrupted);
    assert!(r3.message.is_none());
    assert_eq!(r3.generated, 0);
    assert_eq!(chat.conversation.messages.len(), 4);
    assert_eq!(chat.cached().len(), session.pos);
    assert_eq!(session.pos, r3.reused + r3.prefilled);
}

// The decode loop allocates nothing on the GPU: after a warm-up, further tokens (sampled,
// through the chat path) create no buffer and no bind group, and the memory wgpu holds for
// buffers does not grow.

/// Tokens before the first snapshot (the prefill and the first decode steps), and tokens
/// measured after it.
const WARM_UP: usize = 8;
const MEASURED: usize = 33;

#[test]
fn decode_creates_no_buffers_or_bind_groups_after_warm_up() {
    // Sampling over the whole vocabulary stays on the host (logits read back every token).
    decode_allocates_nothing(SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 0,
        seed: 7,
        repeat_penalty: 1.1,
        repeat_last_n: 64,
        ..Default::default()
    });
}

#[test]
fn gpu_picking_creates_no_buffers_or_bind_groups_after_warm_up() {
    // Greedy, and chat's default sampling, both picked on the GPU one step ahead.
    decode_allocates_nothing(SamplingParams::default());
    decode_allocates_nothing(SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 40,
        seed: 7,
        repeat_penalty: 1.1,
        repeat_last_n: 64,
        ..Default::default()
    });
}

fn decode_allocates_nothing(params: SamplingParams) {
    let (tok, template, model) = builtin_chat_model();
    let gpu = model.gpu.clone();
    let ctx = 512;
    let mut session = model.session(ctx).unwrap();
    let mut chat = Chat::new(ChatFormat::new(template), None);
    let mut sampler = Sampler::new(params);
    let opts = ReplyOptions {
        max_tokens: WARM_UP + MEASURED,
        // No eos: the reply runs to max_tokens.
        eos: vec![],
        stop: vec![],
    };
    // A prompt longer than the indexer's top-k (64 for this model), so the whole reply runs
    // with the selection kernels at their steady state.
    let user = "Good morrow, my lord. I bring thee tidings from the court of the king, where \
                the nobles gather in the great hall and speak of war, of peace, of love and of \
                the fortunes of the realm, and the queen weeps in her chamber for her son, \
                who rode to the north with all his men. What sayest thou to these tidings?";
    let plan = match chat.prepare(&tok, user, ctx, opts.max_tokens).unwrap() {
        Prepared::Ready(p) => p,
        Prepared::TooLong { .. } => panic!("fits"),
    };
    assert!(plan.prompt.len() > 64, "prompt of {}", plan.prompt.len());

    let mut tokens = 0;
    let mut before: Option<GpuStats> = None;
    let r = chat
        .reply(&mut session, &tok, plan, &mut sampler, &opts, |e| {
            if let ChatEvent::Token(_) = e {
                tokens += 1;
                if tokens == WARM_UP {
                    before = Some(gpu.stats());
                }
            }
            true
        })
        .unwrap();
    assert_eq!(r.generated, WARM_UP + MEASURED);
    gpu.sync().unwrap();
    let after = gpu.stats();
    let before = before.expect("snapshot after the warm-up");
    eprintln!("after warm-up: {}", before.line());
    eprintln!("after {} more tokens: {}", MEASURED - 1, after.line());
    // MEASURED - 1 forward passes ran between the snapshots (the last token is not run).
    created_nothing(&before, &after, "while decoding");
    assert!(
        after.live_buffers <= before.live_buffers
            && after.live_buffer_bytes <= before.live_buffer_bytes,
        "live buffers grew: {before:?} -> {after:?}"
    );
    if let (Some(a), Some(b)) = (after.allocated_bytes, before.allocated_bytes) {
        assert!(a <= b, "allocator bytes grew: {b} -> {a}");
    }
    assert!(before.live_buffers > 0, "wgpu's counters are on");
}

/// Prefills of new lengths (each records a different dispatch sequence) leave no bind group
/// alive once they are done: only decode steps and chunks of a speculative round's few rows
/// (at most 8) keep theirs for reuse. When prefills cached
/// theirs too, every new length in a long chat added a few hundred that stayed.
#[test]
fn prefills_of_new_lengths_leave_no_bind_groups_behind() {
    let (_, _, model) = builtin_chat_model();
    let gpu = model.gpu.clone();
    let mut session = model.session(512).unwrap();
    let ids = |n: usize, salt: u32| -> Vec<u32> {
        (0..n as u32).map(|i| 7 + (i * 31 + salt) % 900).collect()
    };
    // Past the indexer's top-k (64) first, so the decode steps below all take the same path.
    session.forward(&ids(100, 0), false).unwrap();
    session.forward(&ids(1, 1), false).unwrap();
    gpu.sync().unwrap();
    let before = gpu.stats();
    for (n, salt) in [(13, 2), (40, 3), (77, 4), (19, 5)] {
        session.forward(&ids(n, salt), false).unwrap();
        session.forward(&ids(1, salt), false).unwrap();
    }
    gpu.sync().unwrap();
    let after = gpu.stats();
    eprintln!("after the first prefill and decode step: {}", before.line());
    eprintln!("after four more prefills of new lengths: {}", after.line());
    assert!(
        after.bind_groups_created > before.bind_groups_created,
        "the prefills made their bind groups"
    );
    assert!(
        after.live_bind_groups <= before.live_bind_groups,
        "bind groups left alive by prefills: {} -> {}",
        before.live_bind_groups,
        after.live_bind_groups
    );
    assert!(before.live_bind_groups > 0, "wgpu's counters are on");
}

/// Generation with the token picked on the GPU and one step queued ahead gives the tokens of
/// a plain host loop (forward, read the logits, pick on the host), greedy and sampled with a
/// repetition penalty, and leaves the session and the sampler where that loop would,
/// whichever check stops it: the token budget, eos, the callback or a full context. From
/// there the host loop's sequence continues exactly.
#[test]
fn gpu_picking_matches_the_host_loop_and_stops_in_the_same_state() {
    let greedy = SamplingParams::default();
    let penalized = SamplingParams {
        repeat_penalty: 1.5,
        repeat_last_n: 6,
        ..Default::default()
    };
    let sampled = SamplingParams {
        temperature: 0.9,
        top_p: 0.9,
        top_k: 40,
        seed: 3,
        repeat_penalty: 1.2,
        repeat_last_n: 8,
        ..Default::default()
    };
    let (tok, _, model) = builtin_chat_model();
    for params in [greedy, penalized, sampled] {
        gpu_picking_case(&tok, &model, params);
    }
}

fn gpu_picking_case(tok: &Tokenizer, model: &Model, params: SamplingParams) {
    use sparsa::generate::{Event, Stop};
    let prompt = tok
        .encode("KING RICHARD:\nWhat say you, my lords?")
        .unwrap();
    let p = prompt.len();
    let n = 10;
    // The reference: n + 1 tokens from the host loop.
    let mut s = model.session(p + n + 1).unwrap();
    let mut host = Sampler::new(params.clone());
    let mut recent = prompt.clone();
    let mut want = vec![host.sample_after(s.forward(&prompt, false).unwrap().last(), &recent)];
    while want.len() < n + 1 {
        recent.push(want[want.len() - 1]);
        let l = s.forward(&[want[want.len() - 1]], false).unwrap();
        want.push(host.sample_after(l.last(), &recent));
    }
    drop(s);
    assert!(Sampler::new(params.clone()).gpu_can_pick());
    // `stop_at`: the callback stops at that token (1-based; 0 never).
    let run = |ctx: usize, max_tokens: usize, eos: &[u32], stop_at: usize| {
        let mut s = model.session(ctx).unwrap();
        let mut sampler = Sampler::new(params.clone());
        let mut seen = 0;
        let (out, why) =
            generate_events(&mut s, &[], &prompt, max_tokens, &mut sampler, eos, |e| {
                if let Event::Token(_) = e {
                    seen += 1;
                }
                stop_at == 0 || seen != stop_at
            })
            .unwrap();
        // The session holds the prompt and every generated token but the last, and the
        // sampler has drawn once per sampled token: running that last token and picking on
        // the host gives the reference's next token.
        assert_eq!(s.pos, p + out.len() - 1, "{why:?}: session position");
        let next = if s.pos < ctx {
            let l = s.forward(&out[out.len() - 1..], false).unwrap();
            let mut r = prompt.clone();
            r.extend_from_slice(&out);
            Some(sampler.sample_after(l.last(), &r))
        } else {
            None
        };
        (out, why, next)
    };
    let what = format!("{params:?}");
    let (out, why, next) = run(p + n + 1, n, &[], 0);
    assert_eq!(
        (&out[..], why, next),
        (&want[..n], Stop::MaxTokens, Some(want[n])),
        "{what}"
    );
    // eos: a token of the reference that first occurs at position k > 0.
    let k = (1..n)
        .find(|&k| !want[..k].contains(&want[k]))
        .expect("a new token among the first ten");
    let (out, why, next) = run(p + n + 1, n, &[want[k]], 0);
    assert_eq!(
        (&out[..], why, next),
        (&want[..=k], Stop::Eos, Some(want[k + 1])),
        "{what}"
    );
    let (out, why, next) = run(p + n + 1, n, &[], 3);
    assert_eq!(
        (&out[..], why, next),
        (&want[..3], Stop::Callback, Some(want[3])),
        "{what}"
    );
    // A context of p + 4 holds the prompt and 4 tokens: the fifth is produced, not run.
    let (out, why, next) = run(p + 4, n, &[], 0);
    assert_eq!(
        (&out[..], why, next),
        (&want[..5], Stop::ContextFull, None),
        "{what}"
    );
    // Stops on the first token (no step was queued ahead for it).
    let (out, why, next) = run(p + n + 1, 1, &[], 0);
    assert_eq!(
        (&out[..], why, next),
        (&want[..1], Stop::MaxTokens, Some(want[1])),
        "{what}"
    );
}

/// Ctrl-C as the first token arrives (the callback refuses its `Token` event): no text was
/// written, so the turn is dropped with its message, as the README says, and the next turn
/// runs as if it never happened.
#[test]
fn interrupt_at_the_first_token_drops_the_turn() {
    let (tok, template, model) = builtin_chat_model();
    let ctx = 128;
    let mut session = model.session(ctx).unwrap();
    let mut chat = Chat::new(ChatFormat::new(template), None);
    let mut sampler = Sampler::new(SamplingParams::default());
    let opts = ReplyOptions {
        max_tokens: 4,
        eos: vec![],
        stop: vec![],
    };
    let Prepared::Ready(plan) = chat.prepare(&tok, "Good morrow.", ctx, 4).unwrap() else {
        panic!("fits")
    };
    let r = chat
        .reply(&mut session, &tok, plan, &mut sampler, &opts, |e| {
            !matches!(e, ChatEvent::Token(_))
        })
        .unwrap();
    assert_eq!(r.end, ReplyEnd::Interrupted);
    assert_eq!(
        r.generated, 1,
        "the token was sampled before the callback refused it"
    );
    assert!(
        r.message.is_none(),
        "no empty reply is stored: {:?}",
        r.message
    );
    assert!(
        chat.conversation.messages.is_empty(),
        "the user message is taken back: {:?}",
        chat.conversation.messages
    );
    // A reply interrupted after its first text is kept.
    let Prepared::Ready(plan) = chat.prepare(&tok, "Good morrow.", ctx, 4).unwrap() else {
        panic!("fits")
    };
    let mut texts = 0;
    let r = chat
        .reply(&mut session, &tok, plan, &mut sampler, &opts, |e| {
            if let ChatEvent::Text(_, s) = e {
                texts += usize::from(!s.trim().is_empty());
            }
            texts < 1
        })
        .unwrap();
    assert_eq!(r.end, ReplyEnd::Interrupted);
    assert!(r.message.is_some_and(|m| !m.content.is_empty()));
    assert_eq!(chat.conversation.messages.len(), 2);
}

/// A speculative round's chunks (the verification's k + 1 rows, the MTP layer's passes over
/// 1 ..= k + 1 verified rows) keep their bind groups like a decode step: the same generation
/// run again makes none (a prompt of at most 8 tokens keeps its prefill's too). The host
/// clock counts the rounds' submissions.
#[test]
fn speculative_rounds_create_no_bind_groups_when_repeated() {
    let (tok, _, model) = builtin_chat_model();
    let gpu = model.gpu.clone();
    let mut session = model.session(512).unwrap();
    session.set_drafts(3).unwrap();
    let prompt = tok.encode("Ham.\nTo be").unwrap();
    assert!(prompt.len() <= 8, "{} prompt tokens", prompt.len());
    let run = |session: &mut sparsa::model::Session| {
        session.reset();
        let mut sampler = Sampler::new(SamplingParams {
            temperature: 0.0,
            ..Default::default()
        });
        // Past the indexer's top-k (64): both selection paths.
        let (out, _) = generate(session, &prompt, 100, &mut sampler, &[], |_| true).unwrap();
        gpu.sync().unwrap();
        (out, gpu.stats(), gpu.host_times())
    };
    let (first, before, host0) = run(&mut session);
    let (second, after, host1) = run(&mut session);
    let host = host1.since(&host0, 1);
    eprintln!("{}", session.draft_stats().line());
    eprintln!("after the first run: {}", before.line());
    eprintln!("after the second: {}", after.line());
    eprintln!("the second run: {}", host.line());
    assert_eq!(first, second);
    assert!(
        session.draft_stats().rounds >= 40,
        "{}",
        session.draft_stats().line()
    );
    created_nothing(&before, &after, "by the repeated speculative rounds");
    // The rounds replayed their recordings, which the session dropped with the reply.
    assert!(
        session.draft_stats().replayed > 0,
        "{}",
        session.draft_stats().line()
    );
    assert_eq!(
        session.round_recordings(),
        0,
        "recordings kept after the reply"
    );
    assert!(host.submits > 0 && host.encode_ms > 0.0, "{}", host.line());
}

/// No buffer and no bind group was created between the two readings.
fn created_nothing(before: &GpuStats, after: &GpuStats, when: &str) {
    assert_eq!(
        after.buffers_created - before.buffers_created,
        0,
        "buffers created {when}"
    );
    assert_eq!(
        after.bind_groups_created - before.bind_groups_created,
        0,
        "bind groups created {when}"
    );
}

/// Greedy speculative rounds run on the GPU ahead of the host (`gpu_rounds` in
/// src/generate.rs): a stop in the middle of a round (an eos token the plain output reaches
/// after some rounds) leaves the session where plain decoding leaves it, with rounds still
/// queued behind it, and the next turn, its rounds and a context that fills up (the host's
/// rounds take over near its end) give the plain tokens.
#[test]
fn gpu_rounds_stop_where_plain_decoding_stops() {
    let (tok, _, model) = builtin_chat_model();
    let ctx = 160;
    let prompt = tok.encode("Ham.\nTo be, or not to be").unwrap();
    let more = tok.encode("\nOph. My lord,").unwrap();
    let greedy = || {
        Sampler::new(SamplingParams {
            temperature: 0.0,
            ..Default::default()
        })
    };
    let mut plain = model.session(ctx).unwrap();
    let (free, _) = generate(&mut plain, &prompt, 60, &mut greedy(), &[], |_| true).unwrap();
    // An eos token whose first use is well into the reply, past a few rounds.
    let at = (12..free.len())
        .find(|&i| !free[..i].contains(&free[i]))
        .expect("a token first used after 12");
    let eos = [free[at]];
    let turns = |drafts: usize| {
        let mut s = model.session(ctx).unwrap();
        s.set_drafts(drafts).unwrap();
        let (a, stop_a) = generate(&mut s, &prompt, 60, &mut greedy(), &eos, |_| true).unwrap();
        let pos_a = s.pos;
        // The next turn runs until the context is full.
        let (b, stop_b) = generate(&mut s, &more, 1000, &mut greedy(), &[], |_| true).unwrap();
        (a, stop_a, pos_a, b, stop_b, s.pos, s.draft_stats())
    };
    let want = turns(0);
    assert_eq!(want.0.len(), at + 1, "the plain reply stops at its eos");
    for k in [1, 3] {
        let got = turns(k);
        assert_eq!(got.0, want.0, "--draft {k}: first turn");
        assert_eq!((got.1, got.2), (want.1, want.2), "--draft {k}: first stop");
        assert_eq!(got.3, want.3, "--draft {k}: second turn");
        assert_eq!((got.4, got.5), (want.4, want.5), "--draft {k}: second stop");
        assert!(got.6.rounds > 10, "--draft {k}: {}", got.6.line());
    }
}

/// `warm_decode` compiles what decoding records, the indexer's scores and top-k included,
/// which only run past `index_topk` positions (64 in the built-in model): a greedy reply
/// that passes it, with and without drafts, compiles nothing more.
#[test]
fn warm_decode_leaves_decoding_nothing_to_compile() {
    let (tok, _, model) = builtin_chat_model();
    let prompt = tok.encode("Ham.\nTo be, or not to be").unwrap();
    let greedy = || {
        Sampler::new(SamplingParams {
            temperature: 0.0,
            ..Default::default()
        })
    };
    for drafts in [0, 3] {
        let mut s = model.session(200).unwrap();
        s.set_drafts(drafts).unwrap();
        pollster::block_on(s.warm_decode(true)).unwrap();
        // The prompt's chunk compiles the variants of its own length.
        let (first, _) = generate(&mut s, &prompt, 1, &mut greedy(), &[], |_| true).unwrap();
        let before = model.gpu.shader_variants();
        let (reply, _) = generate(&mut s, &first, 120, &mut greedy(), &[], |_| true).unwrap();
        assert_eq!(reply.len(), 120);
        assert!(
            s.pos > 64 + 32,
            "--draft {drafts}: the reply ends at {}",
            s.pos
        );
        let after = model.gpu.shader_variants();
        let new: Vec<String> = after
            .iter()
            .filter(|v| !before.contains(v))
            .map(|v| {
                format!(
                    "{}::{} [{}]",
                    v.shader.name,
                    v.entry,
                    v.defines.replace('\n', " ")
                )
            })
            .collect();
        assert!(
            new.is_empty(),
            "--draft {drafts}: compiled while decoding: {new:?}"
        );
    }
}

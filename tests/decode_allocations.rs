//! The decode loop allocates nothing on the GPU: after a warm-up, further tokens (sampled,
//! through the chat path) create no buffer and no bind group, and the memory wgpu holds for
//! buffers does not grow.

use sparsa::chat::{Chat, ChatEvent, ChatFormat, ChatTemplate, Prepared, ReplyOptions};
use sparsa::generate::{Sampler, SamplingParams};
use sparsa::gpu::{Gpu, GpuStats};
use sparsa::model::{Model, ModelSource};
use std::sync::Arc;

/// Tokens before the first snapshot (the prefill and the first decode steps), and tokens
/// measured after it.
const WARM_UP: usize = 8;
const MEASURED: usize = 33;

#[test]
fn decode_creates_no_buffers_or_bind_groups_after_warm_up() {
    let src = ModelSource::builtin().expect("built-in model");
    let tok = src.tokenizer().unwrap();
    let template =
        ChatTemplate::from_config_texts(src.tokenizer_config.as_deref().unwrap(), None).unwrap();
    let gpu =
        Arc::new(Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter"));
    let model = Model::from_source(&src, gpu.clone(), &mut |_, _| {}).expect("model loads");
    let ctx = 512;
    let mut session = model.session(ctx).unwrap();
    let mut chat = Chat::new(ChatFormat::new(template), None);
    let mut sampler = Sampler::new(SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 40,
        seed: 7,
        repeat_penalty: 1.1,
        repeat_last_n: 64,
    });
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
                // The logits of this token were read back just now: the GPU is idle.
                if tokens == WARM_UP {
                    before = Some(gpu.stats());
                }
            }
            true
        })
        .unwrap();
    assert_eq!(r.generated, WARM_UP + MEASURED);
    // The last decode step's logits were read back and the GPU is idle again.
    gpu.sync().unwrap();
    let after = gpu.stats();
    let before = before.expect("snapshot after the warm-up");
    eprintln!("after warm-up: {}", before.line());
    eprintln!("after {} more tokens: {}", MEASURED - 1, after.line());
    // MEASURED - 1 forward passes ran between the snapshots (the last token is not run).
    assert_eq!(
        after.buffers_created - before.buffers_created,
        0,
        "buffers created while decoding"
    );
    assert_eq!(
        after.bind_groups_created - before.bind_groups_created,
        0,
        "bind groups created while decoding"
    );
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

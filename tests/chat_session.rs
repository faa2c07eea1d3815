//! [`Chat`] against a real session of the built-in model: the second turn prefills only what
//! the caches do not hold, and still produces exactly what a fresh prefill of the whole
//! rendered conversation produces; an interrupted prefill leaves the caches consistent.

use sparsa::chat::{Chat, ChatEvent, ChatFormat, ChatTemplate, Prepared, ReplyEnd, ReplyOptions};
use sparsa::generate::{generate_with, Sampler, SamplingParams};
use sparsa::gpu::Gpu;
use sparsa::model::{Model, ModelSource};
use std::sync::Arc;

#[test]
fn second_turn_reuses_the_cache_and_matches_a_fresh_prefill() {
    let src = ModelSource::builtin().expect("built-in model");
    let tok = src.tokenizer().unwrap();
    let template =
        ChatTemplate::from_config_texts(src.tokenizer_config.as_deref().unwrap(), None).unwrap();
    let gpu =
        Arc::new(Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter"));
    let model = Model::from_source(&src, gpu, &mut |_, _| {}).expect("model loads");
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
    let (want, _) = generate_with(
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

//! Chat templates against transformers: every case of tests/data/chat/expected.json (written by
//! tests/reference/make_chat_refs.py with transformers' own apply_chat_template) must render byte
//! for byte the same, plus the error paths, the plain fallback and the template discovery rules.
use serde_json::{json, Map, Value};
use sparsa::chat::{ChatTemplate, Message};
use sparsa::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

fn chat_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn bard_config() -> String {
    read(&chat_dir().join("sparsa-bard-12m/tokenizer_config.json"))
}

/// The template a case of expected.json is rendered with.
fn template_for(fixture: &str) -> ChatTemplate {
    let dir = chat_dir();
    match fixture.strip_prefix("features/") {
        Some(feature) => {
            let jinja = read(&dir.join("features").join(format!("{feature}.jinja")));
            ChatTemplate::from_config_texts(&bard_config(), Some(&jinja))
                .unwrap()
                .expect("a feature template")
        }
        None => ChatTemplate::from_dir(&dir.join(fixture))
            .unwrap()
            .unwrap_or_else(|| panic!("{fixture} has a chat template")),
    }
}

fn render(
    t: &ChatTemplate,
    messages: &[Message],
    gen: bool,
    extra: Value,
) -> sparsa::Result<String> {
    let extra: Map<String, Value> = match extra {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    t.render(messages, gen, &extra)
}

fn user(content: &str) -> Message {
    Message::new("user", content)
}

#[test]
fn every_case_renders_as_transformers_does() {
    let expected: Value =
        serde_json::from_str(&read(&chat_dir().join("expected.json"))).expect("expected.json");
    assert_eq!(expected["transformers"], "5.24.0");
    let cases = expected["cases"].as_array().expect("cases");
    assert!(cases.len() >= 50, "only {} cases", cases.len());
    let tokenizer =
        Tokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m"))
            .expect("bard tokenizer");
    let mut failures = Vec::new();
    let mut fixtures_seen = std::collections::BTreeSet::new();
    for case in cases {
        let fixture = case["fixture"].as_str().unwrap();
        let name = format!("{fixture}/{}", case["case"].as_str().unwrap());
        fixtures_seen.insert(fixture.to_string());
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let got = render(
            &template_for(fixture),
            &messages,
            gen,
            case["extra"].clone(),
        );
        match (&got, case.get("rendered"), case.get("error")) {
            (Ok(text), Some(want), None) => {
                if want.as_str() != Some(text.as_str()) {
                    failures.push(format!("{name}:\n  want {want}\n  got  {}", json!(text)));
                } else if let Some(ids) = case.get("input_ids") {
                    let want_ids: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
                    let got_ids = tokenizer.encode_raw(text).unwrap();
                    if got_ids != want_ids {
                        failures.push(format!("{name}: ids {got_ids:?} != {want_ids:?}"));
                    }
                }
            }
            (Err(e), None, Some(want)) => {
                // transformers reports "TemplateError: <message>"; the message must surface.
                let msg = want.as_str().unwrap();
                let msg = msg.split_once(": ").map_or(msg, |(_, m)| m);
                if !e.to_string().contains(msg) {
                    failures.push(format!("{name}: error {e:?} does not contain {msg:?}"));
                }
            }
            _ => failures.push(format!("{name}: got {got:?}, expected {case}")),
        }
    }
    for f in [
        "glm-4.7",
        "deepseek-v3.2-exp",
        "sparsa-bard-12m",
        "features/control",
    ] {
        assert!(fixtures_seen.contains(f), "no case for {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn fixtures_are_the_published_files() {
    // The fixtures are the published bytes (see tests/data/chat/README.md); their SHA-256 is
    // recorded there. Here: spot checks that they were not reformatted.
    let glm = read(&chat_dir().join("glm-4.7/chat_template.jinja"));
    assert_eq!(glm.len(), 3120);
    assert!(glm.starts_with("[gMASK]<sop>\n{%- if tools -%}") && glm.ends_with("{%- endif -%}"));
    let ds = read(&chat_dir().join("deepseek-v3.2-exp/tokenizer_config.json"));
    assert_eq!(ds.len(), 4062);
    assert!(!chat_dir()
        .join("deepseek-v3.2-exp/chat_template.jinja")
        .exists());
}

#[test]
fn special_tokens_come_from_the_config() {
    let ds = template_for("deepseek-v3.2-exp");
    let tokens: Vec<(&str, &str)> = ds
        .special_tokens()
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    // AddedToken objects give their content; unk_token is null, so it is not defined.
    assert_eq!(
        tokens,
        [
            ("bos_token", "<｜begin▁of▁sentence｜>"),
            ("eos_token", "<｜end▁of▁sentence｜>"),
            ("pad_token", "<｜end▁of▁sentence｜>")
        ]
    );
    let t = ChatTemplate::from_config_texts(
        r#"{"eos_token": "E", "extra_special_tokens": {"image_token": {"content": "<img>"}},
            "chat_template": "{{ eos_token }}|{{ image_token }}|{{ bos_token is defined }}"}"#,
        None,
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        render(&t, &[user("x")], false, json!({})).unwrap(),
        "E|<img>|False"
    );
    // A keyword argument overrides a special token of the same name, as in transformers.
    assert_eq!(
        render(&t, &[user("x")], false, json!({"eos_token": "X"})).unwrap(),
        "X|<img>|False"
    );
}

#[test]
fn template_discovery_follows_transformers() {
    let config = r#"{"eos_token": "</s>", "chat_template": "from config"}"#;
    let from_config = ChatTemplate::from_config_texts(config, None)
        .unwrap()
        .unwrap();
    assert_eq!(
        render(&from_config, &[user("x")], true, json!({})).unwrap(),
        "from config"
    );
    // chat_template.jinja wins over the config.
    let from_jinja = ChatTemplate::from_config_texts(config, Some("from jinja {{ eos_token }}"))
        .unwrap()
        .unwrap();
    assert_eq!(
        render(&from_jinja, &[user("x")], true, json!({})).unwrap(),
        "from jinja </s>"
    );
    // A list of named templates: "default" is used.
    let list = r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#;
    let t = ChatTemplate::from_config_texts(list, None)
        .unwrap()
        .unwrap();
    assert_eq!(render(&t, &[user("x")], true, json!({})).unwrap(), "D");
    let no_default = r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#;
    let e = ChatTemplate::from_config_texts(no_default, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("default") && e.contains("tool_use"),
        "{e}"
    );
    // No template at all.
    assert!(
        ChatTemplate::from_config_texts(r#"{"eos_token": "</s>"}"#, None)
            .unwrap()
            .is_none()
    );
    assert!(
        ChatTemplate::from_config_texts(r#"{"chat_template": null}"#, None)
            .unwrap()
            .is_none()
    );
    let empty = std::env::temp_dir().join(format!("sparsa-chat-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    assert!(ChatTemplate::from_dir(&empty).unwrap().is_none());
    std::fs::remove_dir_all(&empty).unwrap();
    // The repository's own small model has one.
    let bard = ChatTemplate::from_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m"),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        render(&bard, &[user("hi")], true, json!({})).unwrap(),
        "[gMASK]<sop><|user|>\nhi<|assistant|>\n"
    );
}

#[test]
fn syntax_errors_name_the_file_and_line() {
    let e =
        ChatTemplate::from_config_texts(r#"{"chat_template": "ok\n{% if x %}never closed"}"#, None)
            .unwrap_err()
            .to_string();
    assert!(
        e.starts_with("tokenizer_config.json: invalid chat template: syntax error"),
        "{e}"
    );
    assert!(e.contains("chat_template:2"), "{e}");
    let e = ChatTemplate::from_config_texts("{}", Some("line one\nline two\n{{ a + }}"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("chat_template.jinja: invalid chat template: syntax error"),
        "{e}"
    );
    assert!(e.contains("chat_template:3"), "{e}");
    let e = ChatTemplate::from_config_texts("{not json", None)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("tokenizer_config.json: not valid JSON"),
        "{e}"
    );
    let e = ChatTemplate::from_config_texts(r#"{"chat_template": 3}"#, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("chat_template must be a string"), "{e}");
    let e = ChatTemplate::from_config_texts(r#"{"bos_token": 5, "chat_template": "x"}"#, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bos_token must be a string or an AddedToken object"),
        "{e}"
    );
}

#[test]
fn raise_exception_and_render_errors_surface() {
    let jinja = read(&chat_dir().join("features/raise.jinja"));
    let t = ChatTemplate::from_config_texts(&bard_config(), Some(&jinja))
        .unwrap()
        .unwrap();
    let e = render(
        &t,
        &[user("x"), Message::new("tool", "y")],
        false,
        json!({}),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("chat_template.jinja: the chat template raised an error: Unknown role: tool"),
        "{e}"
    );
    assert!(e.contains("chat_template:3"), "{e}");
    // An error of the template itself (attribute of an undefined value).
    let t = ChatTemplate::from_config_texts(r#"{"chat_template": "{{ nothing.attr }}"}"#, None)
        .unwrap()
        .unwrap();
    let e = render(&t, &[user("x")], false, json!({}))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("tokenizer_config.json: rendering the chat template failed"),
        "{e}"
    );
    // render sets messages and add_generation_prompt itself.
    let e = render(&t, &[user("x")], false, json!({"messages": []}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`messages` is set by render"), "{e}");
}

#[test]
fn plain_fallback_is_the_documented_layout() {
    let plain = ChatTemplate::plain();
    let conversation = [
        Message::new("system", "Be brief."),
        user("Hi"),
        Message {
            role: "assistant".into(),
            content: "Hello.".into(),
            reasoning_content: Some("left out".into()),
        },
        user("Bye"),
    ];
    assert_eq!(
        render(&plain, &conversation[..2], true, json!({})).unwrap(),
        "System: Be brief.\n\nUser: Hi\n\nAssistant:"
    );
    assert_eq!(
        render(
            &plain,
            &conversation,
            false,
            json!({"enable_thinking": true})
        )
        .unwrap(),
        "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello.\n\nUser: Bye\n\n"
    );
    assert_eq!(render(&plain, &[], true, json!({})).unwrap(), "Assistant:");
    assert!(plain.special_tokens().is_empty());
    assert!(!plain.supports_thinking());
}

#[test]
fn supports_thinking_reads_the_template() {
    assert!(template_for("glm-4.7").supports_thinking()); // enable_thinking
    assert!(template_for("deepseek-v3.2-exp").supports_thinking()); // thinking
    assert!(!template_for("sparsa-bard-12m").supports_thinking());
    let literal = ChatTemplate::from_config_texts(
        r#"{"chat_template": "thinking <think>{{ 'enable_thinking' }}"}"#,
        None,
    )
    .unwrap()
    .unwrap();
    assert!(!literal.supports_thinking());
}

#[test]
fn strftime_now_gives_the_date() {
    let t = ChatTemplate::from_config_texts(
        r#"{"chat_template": "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}"}"#,
        None,
    )
    .unwrap()
    .unwrap();
    let out = render(&t, &[user("x")], false, json!({})).unwrap();
    let (iso, human) = out.split_once('|').unwrap();
    let parts: Vec<&str> = iso.split('-').collect();
    assert_eq!(parts.len(), 3, "{out}");
    let year: u32 = parts[0].parse().unwrap();
    assert!(year >= 2025, "{out}");
    assert!(
        human.ends_with(parts[0]) && human.starts_with(parts[2]),
        "{out}"
    );
}

/// `render_json` (messages as JSON objects, what `sparsa serve` renders) gives every case the
/// same text as `render`; and assistant tool calls and tool results reach the GLM and
/// DeepSeek templates in the shapes their own markup expects.
#[test]
fn json_messages_render_as_typed_ones_and_carry_tool_calls() {
    let expected: Value =
        serde_json::from_str(&read(&chat_dir().join("expected.json"))).expect("expected.json");
    let mut checked = 0;
    for case in expected["cases"].as_array().unwrap() {
        let Some(want) = case.get("rendered").and_then(Value::as_str) else {
            continue;
        };
        let fixture = case["fixture"].as_str().unwrap();
        let messages: Vec<Value> = case["messages"].as_array().unwrap().clone();
        let extra: Map<String, Value> = case["extra"].as_object().cloned().unwrap_or_default();
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let got = template_for(fixture).render_json(&messages, gen, &extra);
        assert_eq!(
            got.as_deref().ok(),
            Some(want),
            "{fixture}/{}",
            case["case"]
        );
        checked += 1;
    }
    assert!(checked >= 40, "{checked}");
    let conversation = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    ]);
    let glm = template_for("glm-4.7")
        .render_json(conversation.as_array().unwrap(), true, &Map::new())
        .unwrap();
    assert!(
        glm.contains("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"),
        "{glm}"
    );
    assert!(
        glm.contains("<|observation|><tool_response>sunny</tool_response>"),
        "{glm}"
    );
    let mut ds = conversation.clone();
    ds[1]["content"] = Value::Null;
    ds[1]["tool_calls"][0]["function"]["arguments"] = json!("{\"city\": \"Oslo\"}");
    let text = template_for("deepseek-v3.2-exp")
        .render_json(ds.as_array().unwrap(), true, &Map::new())
        .unwrap();
    assert!(
        text.contains("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜>"),
        "{text}"
    );
    assert!(
        text.contains("<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>"),
        "{text}"
    );
}

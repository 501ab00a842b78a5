//! Constrained decoding through the real engine on a random-weight model
//! (kore-pack's synth, the default pack's tokenizer): 100 greedy and seeded
//! generations over ten JSON Schemas all parse and validate with the
//! `jsonschema` crate; tool calls parse and validate against their tool;
//! a sequence gives the same tokens batched with others as alone; the stop
//! token comes only once the output is complete; log-probabilities are the
//! model's log-softmax.

use std::path::PathBuf;
use std::sync::Arc;

use kore_appliance::{grammar_vocab, stop_ids, ModelEngine};
use kore_engine::Model;
use kore_grammar::json::Value as GValue;
use kore_grammar::{parse_tool_calls, Grammar, Options, ToolChoice, ToolSet};
use kore_pack::config::{LayerType, PackConfig};
use kore_pack::{NoProgress, Pack};
use kore_service::{Engine, GenParams, StepOut};
use kore_tokenizer::Tokenizer;

fn tiny_tokenizer() -> Tokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny");
    Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
}

/// A random-weight Qwen3.5-shaped pack over the tiny tokenizer's 4096 ids.
fn random_pack(tag: &str) -> Pack {
    let dir = std::env::temp_dir().join(format!("kore-constrained-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = PackConfig {
        vocab_size: 4096,
        hidden_size: 64,
        intermediate_size: 96,
        num_hidden_layers: 4,
        layer_types: vec![
            LayerType::LinearAttention,
            LayerType::LinearAttention,
            LayerType::LinearAttention,
            LayerType::FullAttention,
        ],
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        attn_output_gate: true,
        linear_num_key_heads: 2,
        linear_num_value_heads: 4,
        linear_key_head_dim: 16,
        linear_value_head_dim: 16,
        linear_conv_kernel_dim: 4,
        rms_norm_eps: 1e-6,
        rope_theta: 1e7,
        partial_rotary_factor: 0.25,
        tie_word_embeddings: false,
        mtp_num_hidden_layers: 1,
        max_position_embeddings: 4096,
        eos_token_ids: vec![4072],
        moe: None,
    };
    kore_pack::synth::synth_config("constrained", config, &dir, 11, &NoProgress).unwrap()
}

/// Ten schemas whose every output is bounded (no free strings: a random
/// model rarely closes one, so those are covered by kore-grammar's tests).
const SCHEMAS: [&str; 10] = [
    r#"{"type":"object","properties":{"name":{"enum":["ann","bob"]},"age":{"type":"integer"}},"required":["name","age"]}"#,
    r#"{"type":"array","items":{"type":"number"},"minItems":1,"maxItems":4}"#,
    r#"{"enum":["red","green","blue"]}"#,
    r#"{"type":"object","properties":{"ok":{"type":"boolean"},"note":{"anyOf":[{"const":"n/a"},{"type":"null"}]}},"required":["ok"]}"#,
    r#"{"type":"object","properties":{"tags":{"type":"array","items":{"enum":["x","y"]},"maxItems":3},"n":{"const":7}},"required":["tags","n"]}"#,
    r##"{"$defs":{"p":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x","y"]}},"type":"object","properties":{"a":{"$ref":"#/$defs/p"},"b":{"$ref":"#/$defs/p"}},"required":["a"]}"##,
    r#"{"anyOf":[{"type":"integer"},{"type":"object","properties":{"err":{"type":"boolean"}},"required":["err"]}]}"#,
    r#"{"type":"object","properties":{"id":{"type":"integer"},"flags":{"type":"array","items":{"type":"boolean"},"maxItems":5}},"required":["id"]}"#,
    r##"{"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/t"},"maxItems":2}},"required":["v"]}},"$ref":"#/$defs/t"}"##,
    r#"{"type":"object","properties":{"q":{"type":"string","enum":["a\"b","c\\d","é"]},"z":{"type":"null"}},"required":["q","z"]}"#,
];

struct Fixture {
    tok: Arc<Tokenizer>,
    stops: Vec<u32>,
}

fn engine<'m>(model: &'m Model<'m>, f: &Fixture, max: usize) -> ModelEngine<'m> {
    let vocab = Arc::new(grammar_vocab(&f.tok, model.config.vocab_size));
    ModelEngine::new(model, "random", f.stops.clone())
        .with_max_sequences(max)
        .with_grammar_vocab(vocab)
}

/// Runs every `(prompt, params)` to its end with at most `max` together;
/// returns each one's tokens.
fn run(engine: &mut ModelEngine<'_>, jobs: &[(Vec<u32>, GenParams)], max: usize) -> Vec<Vec<u32>> {
    let mut out = vec![Vec::new(); jobs.len()];
    let mut next = 0;
    let mut running: Vec<usize> = Vec::new();
    let mut steps = Vec::<StepOut>::new();
    while next < jobs.len() || !running.is_empty() {
        while running.len() < max && next < jobs.len() {
            engine.start(next as u64, &jobs[next].0, &jobs[next].1).unwrap();
            running.push(next);
            next += 1;
        }
        steps.clear();
        engine.step(&mut steps);
        for s in steps.drain(..) {
            let i = s.seq as usize;
            let toks = s.result.unwrap();
            out[i].extend(&toks);
            let ended =
                toks.iter().any(engine_stop) || out[i].len() >= jobs[i].1.max_tokens as usize;
            if ended {
                engine.finish(s.seq);
                running.retain(|&r| r != i);
            }
        }
    }
    out
}

fn engine_stop(t: &u32) -> bool {
    *t == 4072 || *t == 4070
}

fn validator(schema: &str) -> jsonschema::Validator {
    jsonschema::validator_for(&serde_json::from_str(schema).unwrap()).unwrap()
}

fn text_of(f: &Fixture, tokens: &[u32]) -> String {
    let body: Vec<u32> = tokens.iter().copied().filter(|t| !f.stops.contains(t)).collect();
    f.tok.decode(&body)
}

#[test]
fn hundred_constrained_generations_parse_and_validate() {
    let pack = random_pack("schemas");
    let model = pack.model().unwrap();
    let tok = Arc::new(tiny_tokenizer());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let f = Fixture { tok: tok.clone(), stops };
    let prompt = tok.encode("<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n");
    let mut jobs = Vec::new();
    for (i, s) in SCHEMAS.iter().enumerate() {
        let g =
            Arc::new(Grammar::json_schema(&GValue::parse(s).unwrap(), Options::default()).unwrap());
        for k in 0..10u64 {
            let temperature = if k == 0 { 0.0 } else { 1.0 };
            let params = GenParams {
                max_tokens: 1500,
                temperature,
                top_p: if k % 2 == 0 { 1.0 } else { 0.9 },
                top_k: if k % 3 == 0 { 0 } else { 40 },
                seed: 1000 * i as u64 + k,
                constraint: Some(g.clone()),
                ..GenParams::default()
            };
            jobs.push((prompt.clone(), params));
        }
    }
    let mut e = engine(&model, &f, 8);
    let outs = run(&mut e, &jobs, 8);
    for (j, out) in outs.iter().enumerate() {
        let schema = SCHEMAS[j / 10];
        assert!(
            out.last().is_some_and(engine_stop),
            "job {j} did not finish: {:?}",
            text_of(&f, out)
        );
        let text = text_of(&f, out);
        let doc: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("job {j} ({schema}): {e}: {text:?}"));
        assert!(validator(schema).is_valid(&doc), "job {j} ({schema}): {text}");
    }
    // The same jobs one at a time give the same tokens (sampling per sequence).
    let sample: Vec<(Vec<u32>, GenParams)> = jobs.iter().step_by(7).cloned().collect();
    let mut alone = engine(&model, &f, 1);
    let want: Vec<Vec<u32>> = outs.iter().step_by(7).cloned().collect();
    assert_eq!(run(&mut alone, &sample, 1), want);
}

#[test]
fn tool_calls_parse_and_validate_against_their_tool() {
    let pack = random_pack("tools");
    let model = pack.model().unwrap();
    let tok = Arc::new(tiny_tokenizer());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let f = Fixture { tok: tok.clone(), stops };
    let tools_json = r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
        "properties":{"city":{"type":"string","enum":["Paris","Köln"]},"unit":{"type":"string","enum":["c","f"]},
        "days":{"type":"integer"}},"required":["city","days"]}}},
        {"type":"function","function":{"name":"lookup","parameters":{"type":"object",
        "properties":{"ids":{"type":"array","items":{"type":"integer"},"maxItems":3},"exact":{"type":"boolean"}},
        "required":["ids"]}}}]"#;
    let tools = ToolSet::from_openai(&GValue::parse(tools_json).unwrap()).unwrap();
    let prompt = tok.encode("<|im_start|>user\nCall a tool.<|im_end|>\n<|im_start|>assistant\n");
    let mut jobs = Vec::new();
    for k in 0..20u64 {
        let choice =
            if k % 4 == 3 { ToolChoice::Named("lookup".into()) } else { ToolChoice::Required };
        let g = Grammar::tools(tools.clone(), choice, k % 2 == 0, Options::default()).unwrap();
        let temperature = if k < 2 { 0.0 } else { 1.0 };
        let params = GenParams {
            max_tokens: 1500,
            temperature,
            seed: k,
            constraint: Some(Arc::new(g)),
            ..GenParams::default()
        };
        jobs.push((prompt.clone(), params));
    }
    let mut e = engine(&model, &f, 8);
    let outs = run(&mut e, &jobs, 8);
    for (j, out) in outs.iter().enumerate() {
        let text = text_of(&f, out);
        assert!(out.last().is_some_and(engine_stop), "job {j} did not finish: {text:?}");
        let (content, calls) =
            parse_tool_calls(&text, &tools).unwrap_or_else(|e| panic!("job {j}: {e}: {text:?}"));
        assert!(content.trim().is_empty(), "job {j}: {content:?}");
        assert!(!calls.is_empty(), "job {j}");
        for c in calls {
            let tool = tools.get(&c.name).unwrap();
            let schema: serde_json::Value =
                serde_json::from_str(&tool.parameters.to_compact_json()).unwrap();
            let args: serde_json::Value =
                serde_json::from_str(&c.arguments.to_compact_json()).unwrap();
            assert!(jsonschema::validator_for(&schema).unwrap().is_valid(&args), "job {j}: {args}");
        }
    }
}

#[test]
fn stop_waits_for_completion_and_logprobs_are_the_log_softmax() {
    let pack = random_pack("stop");
    let model = pack.model().unwrap();
    let tok = Arc::new(tiny_tokenizer());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let f = Fixture { tok: tok.clone(), stops: stops.clone() };
    let g = Arc::new(
        Grammar::json_schema(&GValue::parse(SCHEMAS[0]).unwrap(), Options::default()).unwrap(),
    );
    let prompt = tok.encode("JSON:");
    let mut e = engine(&model, &f, 2);
    let params = GenParams {
        max_tokens: 400,
        constraint: Some(g),
        logprobs: Some(5),
        ..GenParams::default()
    };
    e.start(1, &prompt, &params).unwrap();
    let mut all = Vec::new();
    let mut lps = Vec::new();
    loop {
        let mut out = Vec::new();
        e.step(&mut out);
        let toks = out.pop().unwrap().result.unwrap();
        lps.extend(e.take_logprobs(1));
        all.extend(&toks);
        if toks.iter().any(engine_stop) || all.len() >= 400 {
            break;
        }
    }
    e.finish(1);
    assert_eq!(lps.len(), all.len());
    assert_eq!(lps.iter().map(|l| l.token).collect::<Vec<_>>(), all);
    for l in &lps {
        assert_eq!(l.top.len(), 5);
        assert!(l.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(l.logprob <= l.top[0].1 + 1e-6 && l.logprob <= 0.0);
    }
    // Stop ids appear only at the end, after a complete document.
    let pos = all.iter().position(engine_stop).unwrap();
    assert_eq!(pos, all.len() - 1);
    serde_json::from_str::<serde_json::Value>(&text_of(&f, &all)).unwrap();
    // Without a vocabulary the engine refuses constrained requests.
    let mut bare = ModelEngine::new(&model, "bare", stops);
    let params = GenParams { constraint: params.constraint.clone(), ..GenParams::default() };
    assert!(bare.start(1, &prompt, &params).is_err());
}

#[test]
fn the_vocabulary_is_built_by_the_first_constrained_request() {
    let pack = random_pack("lazy");
    let model = pack.model().unwrap();
    let tok = Arc::new(tiny_tokenizer());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let f = Fixture { tok: tok.clone(), stops: stops.clone() };
    let mut lazy = ModelEngine::new(&model, "random", stops)
        .with_grammar_tokenizer(tok.clone(), model.config.vocab_size);
    assert!(!lazy.grammar_vocab_built());
    let prompt = tok.encode("JSON:");
    let plain = GenParams { max_tokens: 8, ..GenParams::default() };
    run(&mut lazy, &[(prompt.clone(), plain)], 1);
    assert!(!lazy.grammar_vocab_built(), "a plain request built the vocabulary");
    let g = Arc::new(
        Grammar::json_schema(&GValue::parse(SCHEMAS[1]).unwrap(), Options::default()).unwrap(),
    );
    let params = GenParams { max_tokens: 300, constraint: Some(g), ..GenParams::default() };
    let job = [(prompt, params)];
    let got = run(&mut lazy, &job, 1);
    assert!(lazy.grammar_vocab_built());
    // The same answer as an engine given the vocabulary up front.
    assert_eq!(got, run(&mut engine(&model, &f, 1), &job, 1));
}
